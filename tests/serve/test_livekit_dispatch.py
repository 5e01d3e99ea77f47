"""LiveKit dispatch by admission load: the real ``WorkerOptions`` and ``AgentServer`` of livekit-agents.

No LiveKit server runs here, so the worker runs unregistered: its own load loop calls our
``load_fnc`` every half second, as registered, and its HTTP endpoint ``/worker`` reports the
load it would send LiveKit's dispatcher. The engine is the tiny random Llama (cap 2).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx2
import pytest

pytest.importorskip("livekit.agents", reason="the [livekit] extra is not installed")

from livekit.agents import AgentServer, JobContext, WorkerOptions

from metronome_sdk import Engine
from metronome_sdk.integrations.livekit import AdmissionLoad, admission_load, worker_options
from tests.serve.conftest import serving

pytestmark = pytest.mark.timeout(90)


async def _entry(ctx: JobContext) -> None:  # never called: no job reaches an unregistered worker
    raise AssertionError("no job expected")


@asynccontextmanager
async def running(options: WorkerOptions) -> AsyncIterator[str]:
    """The worker, started as LiveKit starts it (minus the connection); its ``/worker`` URL."""
    environ = dict(os.environ)  # run() sets certificate variables for its job processes
    server = AgentServer.from_server_options(options)
    task = asyncio.ensure_future(server.run(devmode=True, unregistered=True))
    try:
        with anyio.fail_after(30):
            while not server.worker_info.http_port:
                assert not task.done(), task
                await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{server.worker_info.http_port}/worker"
    finally:
        await server.aclose()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        os.environ.clear()
        os.environ.update(environ)


async def reported(http: httpx2.AsyncClient, url: str, expected: float) -> float:
    """The load the worker reports, once its load loop has seen ``expected`` (or the last seen)."""
    load = -1.0
    with anyio.move_on_after(10):
        while abs(load - expected) > 1e-9:
            load = float((await http.get(url)).json().get("worker_load", 0.0))
            await asyncio.sleep(0.1)
    return load


async def test_the_worker_reports_the_engine_admission_load(engine: Engine) -> None:
    options = worker_options(_entry, engine=engine, host="127.0.0.1")
    assert isinstance(options, WorkerOptions) and options.load_threshold == 1.0
    assert isinstance(options.load_fnc, AdmissionLoad)
    seen = []
    async with running(options) as url, httpx2.AsyncClient() as http:
        seen.append(await reported(http, url, 0.0))
        first = engine.try_session()
        seen.append(await reported(http, url, 0.5))
        second = engine.try_session()  # the cap (2) is full
        seen.append(await reported(http, url, 1.0))
        await first.aclose()
        seen.append(await reported(http, url, 0.5))
        await second.aclose()
        seen.append(await reported(http, url, 0.0))
    assert seen == [0.0, 0.5, 1.0, 0.5, 0.0]


async def test_the_worker_reports_a_servers_admission_load(engine: Engine) -> None:
    async with await serving(engine, replica_id="r-1") as server:
        options = worker_options(_entry, base_url=server.url, host="127.0.0.1", load_threshold=0.9)
        seen = []
        async with running(options) as url, httpx2.AsyncClient() as http:
            seen.append(await reported(http, url, 0.0))
            held = [engine.try_session(), engine.try_session()]  # the server's cap (2) is full
            seen.append(await reported(http, url, 1.0))
            await held[0].aclose()
            seen.append(await reported(http, url, 0.5))
            await held[1].aclose()
            seen.append(await reported(http, url, 0.0))
    assert seen == [0.0, 1.0, 0.5, 0.0]
    assert options.load_threshold == 0.9


async def test_a_server_that_does_not_answer_is_full(engine: Engine) -> None:
    async with await serving(engine) as server:
        load = AdmissionLoad(base_url=server.url)
        held = engine.try_session()
        assert await anyio.to_thread.run_sync(load) == 0.5
        # behind a balancer: the least loaded replica's load (here the other one is gone)
        fleet = AdmissionLoad(base_url=[server.url, "http://127.0.0.1:9/v1"])
        assert await anyio.to_thread.run_sync(fleet) == 0.5
        await held.aclose()
    assert await anyio.to_thread.run_sync(load) == 1.0  # gone: LiveKit sends this worker nothing
    assert await anyio.to_thread.run_sync(fleet) == 1.0
    await engine.aclose()
    assert AdmissionLoad(engine=engine)() == 1.0  # an engine that closed admits no one


def test_the_load_is_the_highest_share_and_never_past_one() -> None:
    def load(**kw: object) -> float:
        base: dict[str, object] = {"sessions": 1, "limit": 4, "memory_limit": None, "used_blocks": 0}
        return admission_load(**{**base, "pool_blocks": 100, **kw})  # type: ignore[arg-type]

    assert load() == 0.25
    assert load(memory_limit=2) == 0.5  # the pool holds two sessions' bounds
    assert load(used_blocks=80) == 0.8  # the pool is that full now
    assert load(sessions=5) == 1.0  # past the cap (it fell): full, not more
    assert load(failed=True) == 1.0


def test_bad_options_are_refused_when_made() -> None:
    for bad in (0, 1.5, True, "1"):
        with pytest.raises(ValueError, match="load_threshold"):
            worker_options(_entry, load_threshold=bad)  # type: ignore[arg-type]
    for bad_url in ("localhost:8000", [], ["http://a/v1", 7]):
        with pytest.raises(ValueError, match="base_url"):
            AdmissionLoad(base_url=bad_url)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        AdmissionLoad(timeout=0)
