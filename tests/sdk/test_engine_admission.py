"""Opening sessions on an engine: the cap, the nowait twin, waiting for room, readmission."""

from __future__ import annotations

import anyio
import pytest

import metronome_sdk as metronome
from metronome_engine import KVPolicy
from metronome_sdk import AdmissionRejected, InputFrame, Overloaded, SessionClosed
from tests.sdk.conftest import make_engine

pytestmark = pytest.mark.timeout(60)


async def test_opening_beyond_the_cap_raises_admission_rejected() -> None:
    async with make_engine(limit=2) as engine, engine.session() as a, engine.session() as b:
        assert a.id != b.id
        with pytest.raises(AdmissionRejected) as info:
            async with engine.session(timeout=0.01):
                pytest.fail("a third session was admitted past a cap of two")
        err = info.value
        assert isinstance(err, Overloaded)
        assert err.limit == 2
        assert err.in_flight == 2
        assert err.retry_after > 0
        stats = engine.stats()
        assert (stats.sessions, stats.admitted, stats.rejected) == (2, 2, 1)


async def test_nowait_twin_raises_at_once() -> None:
    async with make_engine(limit=1) as engine:
        first = engine.try_session()  # a plain call: nothing is awaited on the way
        assert not first.closed
        with pytest.raises(AdmissionRejected):
            engine.try_session()
        with pytest.raises(AdmissionRejected):
            metronome.Session(engine=engine).open_nowait()
        await first.aclose()


async def test_sessions_are_admitted_again_after_others_close() -> None:
    async with make_engine(limit=2) as engine:
        a = engine.try_session()
        b = engine.try_session()
        with pytest.raises(AdmissionRejected):
            engine.try_session()
        await a.step(InputFrame.from_tokens([5, 6, 7]))
        await a.aclose()
        c = engine.try_session()
        out = await c.step(InputFrame.from_tokens([5, 6, 7]))
        assert out.tokens
        await b.aclose()
        await c.aclose()
        assert engine.stats().sessions == 0


async def test_a_blocking_open_waits_for_room() -> None:
    async with make_engine(limit=1) as engine:
        holder = engine.try_session()
        admitted = anyio.Event()

        async def open_when_room() -> None:
            async with engine.session(timeout=30.0) as s:
                admitted.set()
                await s.step(InputFrame.from_tokens([9]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(open_when_room)
            await anyio.wait_all_tasks_blocked()
            assert not admitted.is_set()  # still waiting at the door
            await holder.aclose()
        assert admitted.is_set()


async def test_memory_guard_caps_sessions_at_what_the_pool_can_hold() -> None:
    # window 8, sinks 4, block 4, chunk 8: a bound of 1 + 4 + 1 = 6 blocks; 20 blocks hold 3 sessions
    engine = make_engine(KVPolicy.windowed(8, sinks=4), num_blocks=20, limit=50)
    async with engine:
        sessions = [engine.try_session() for _ in range(3)]
        assert engine.stats().memory_limit == 3
        assert engine.stats().limit == 3
        assert engine.stats().limit_bound_by is None  # AIMD (the default): its cap is its own feedback
        with pytest.raises(AdmissionRejected) as info:
            engine.try_session()
        assert info.value.limit == 3
        for s in sessions:
            await s.aclose()


async def test_a_refused_session_can_retry_after_room_appears() -> None:
    async with make_engine(limit=1) as engine:
        holder = engine.try_session()
        s = engine.session(timeout=0.0)
        with pytest.raises(AdmissionRejected):
            await s.open()
        with pytest.raises(SessionClosed, match="not open"):
            await s.send(InputFrame.from_tokens([3]))
        await holder.aclose()
        async with s:
            assert (await s.step(InputFrame.from_tokens([3]))).tokens
