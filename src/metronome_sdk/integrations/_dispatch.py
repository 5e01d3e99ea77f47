"""LiveKit dispatch by admission headroom: ``WorkerOptions(load_fnc=..., load_threshold=...)``.

LiveKit's server sends a job to a worker whose reported load is under its ``load_threshold``;
its default load is the machine's CPU, which says nothing about whether Metronome will admit
one more session. ``AdmissionLoad`` reports what admission sees instead: the sessions in
flight over the cap, or over what the block pool holds at every session's bound, or the share
of the pool in use, whichever is highest; 1.0 when admission is full or the engine is down.
It reads ``metronome serve``'s ``/readyz`` (the default, as ``MetronomeLLM`` talks to a server)
or an engine in this process. LiveKit calls ``load_fnc`` from a thread of its executor, every
half second and before it answers a job request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from livekit.agents import JobContext, WorkerOptions

from .._engine import Engine

__all__ = ["AdmissionLoad", "admission_load", "worker_options"]

FULL = 1.0


def admission_load(
    *, sessions: int, limit: int, memory_limit: int | None, used_blocks: int, pool_blocks: int, failed: bool = False
) -> float:
    """The load admission sees, in [0, 1]: 1.0 exactly when it admits no one more."""
    if failed or limit < 1:
        return FULL
    shares = [sessions / limit, used_blocks / pool_blocks if pool_blocks > 0 else 1.0]
    if memory_limit is not None:
        shares.append(sessions / memory_limit if memory_limit > 0 else 1.0)
    return min(FULL, max(0.0, *shares))


def _from_readiness(body: Mapping[str, Any]) -> float:
    if body.get("status") == "unavailable":
        return FULL
    return admission_load(
        sessions=int(body["sessions"]),
        limit=int(body["limit"]),
        memory_limit=None if body.get("memory_limit") is None else int(body["memory_limit"]),
        used_blocks=int(body["used_blocks"]),
        pool_blocks=int(body["pool_blocks"]),
    )


def _engine_now(engine: Engine) -> float:
    stats = engine.stats()
    return admission_load(
        sessions=stats.sessions,
        limit=stats.limit,
        memory_limit=stats.memory_limit,
        used_blocks=stats.used_blocks,
        pool_blocks=stats.pool_blocks,
        failed=stats.failed or engine.closed or engine.failure is not None,
    )


class AdmissionLoad:
    """A ``load_fnc`` for LiveKit's ``WorkerOptions``: Metronome's admission load (see the module).

    ``base_url``: the ``metronome serve`` whose ``/readyz`` is read (``MetronomeLLM``'s
    ``base_url``; ``/v1`` is dropped), or the replicas behind the balancer the workers talk
    to: then the load is the least loaded replica's, as a new session spills to any replica
    with room. A server that does not answer within ``timeout`` seconds counts as full, so
    LiveKit sends no job to a worker whose engine it cannot reach.
    ``engine``: an engine in this process instead; make the ``AdmissionLoad`` on the engine's
    event loop, which it asks for the engine's stats (LiveKit calls from another thread).
    """

    def __init__(
        self,
        *,
        base_url: str | Sequence[str] = "http://127.0.0.1:8000/v1",
        engine: Engine | None = None,
        timeout: float = 1.0,
    ) -> None:
        if engine is not None and not isinstance(engine, Engine):
            raise ValueError(f"engine must be a metronome Engine, got {type(engine).__name__}")
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"base_url must be http(s) URLs like 'http://127.0.0.1:8000/v1', got {base_url!r}")
        seconds = not isinstance(timeout, bool) and isinstance(timeout, int | float) and math.isfinite(timeout)
        if not seconds or timeout <= 0:
            raise ValueError(f"timeout must be seconds > 0, got {timeout!r}")
        self.engine = engine
        self.urls = tuple(u.rstrip("/").removesuffix("/v1") + "/readyz" for u in urls)
        self.timeout = float(timeout)
        self._loop = asyncio.get_running_loop() if engine is not None else None

    def __call__(self) -> float:
        if self.engine is not None:
            return self._engine_load(self.engine)
        return min(self._server_load(url) for url in self.urls)

    def _server_load(self, url: str) -> float:
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as response:
                return _from_readiness(json.load(response))
        except urllib.error.HTTPError as exc:  # 503: full, or going away; the body says which
            with exc:
                try:
                    return _from_readiness(json.load(exc))
                except (ValueError, KeyError, TypeError):
                    return FULL
        except (OSError, ValueError, KeyError, TypeError):
            return FULL  # unreachable or not a Metronome server: send this worker nothing

    def _engine_load(self, engine: Engine) -> float:
        loop = self._loop
        assert loop is not None
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:  # called on the engine's own loop
            return _engine_now(engine)
        done: concurrent.futures.Future[float] = concurrent.futures.Future()

        def on_loop() -> None:  # the engine's state belongs to its loop: read it there
            try:
                done.set_result(_engine_now(engine))
            except Exception as exc:
                done.set_exception(exc)

        try:
            loop.call_soon_threadsafe(on_loop)
            return done.result(timeout=self.timeout)
        except (RuntimeError, TimeoutError):  # the loop closed, or is too busy to answer
            return FULL

    def __repr__(self) -> str:
        return f"AdmissionLoad({'engine' if self.engine is not None else ', '.join(self.urls)})"


def worker_options(
    entrypoint: Callable[[JobContext], Awaitable[None]],
    *,
    base_url: str | Sequence[str] = "http://127.0.0.1:8000/v1",
    engine: Engine | None = None,
    load_threshold: float = FULL,
    **options: Any,
) -> WorkerOptions:
    """LiveKit ``WorkerOptions`` whose load is Metronome's admission load (``AdmissionLoad``).

    ``load_threshold``: the load at which LiveKit stops sending this worker jobs; 1.0 (the
    default) sends jobs while admission has room for one more session; lower it to keep
    headroom. Other ``options`` go to ``WorkerOptions`` as they are.
    """
    if isinstance(load_threshold, bool) or not isinstance(load_threshold, int | float):
        raise ValueError(f"load_threshold must be a number in (0, 1], got {load_threshold!r}")
    if not 0 < load_threshold <= FULL:
        raise ValueError(f"load_threshold must be in (0, 1], got {load_threshold!r}; 1.0 fills admission")
    load = AdmissionLoad(base_url=base_url, engine=engine)
    return WorkerOptions(entrypoint_fnc=entrypoint, load_fnc=load, load_threshold=float(load_threshold), **options)
