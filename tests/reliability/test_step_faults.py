"""Faults injected into the engine step: typed errors for the sessions affected, the beat for the others."""

from __future__ import annotations

import threading

import anyio
import pytest

from metronome_sdk import (
    EngineClosed,
    EngineStalled,
    InputFrame,
    ReliabilityConfig,
    SessionBroken,
    TimingConfig,
)
from tests.sdk.conftest import make_engine
from tests.support import FaultyBackend

pytestmark = pytest.mark.timeout(60)

FRAME = InputFrame.from_tokens([21, 22, 23])
POISON = 77  # a token the faulty backend is told to corrupt


def faults(engine: object) -> FaultyBackend:
    core = engine.core  # type: ignore[attr-defined]
    assert isinstance(core, FaultyBackend)
    return core


def engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("metronome-engine")]


async def test_a_transient_step_exception_is_retried_and_nobody_notices() -> None:
    engine = make_engine(reliability=ReliabilityConfig(step_retries=1), faulty=True)
    async with engine, engine.session() as a, engine.session() as b:
        await a.step(FRAME)
        flaky = faults(engine)
        calls = flaky.calls
        flaky.fail_steps(1)
        await a.send(FRAME)
        await b.send(FRAME)
        outs = [await a.receive(), await b.receive()]
        assert all(o.tokens for o in outs)
        assert [o.index for o in outs] == [1, 0]
        stats = engine.stats()
        assert (stats.step_failures, stats.failed_ticks, stats.failed) == (1, 0, False)
        assert flaky.calls - calls >= 2  # the failed try and its retry (one tick, or two if a's frame went alone)


async def test_a_step_failing_every_try_stalls_its_frames_and_the_sessions_go_on() -> None:
    engine = make_engine(reliability=ReliabilityConfig(step_retries=1, max_failed_ticks=3), faulty=True)
    async with engine, engine.session() as a, engine.session() as idle:
        first = await a.step(FRAME)
        tokens_before = a.stats().num_tokens
        faults(engine).fail_steps(2)  # the try and the retry
        with pytest.raises(EngineStalled) as info:
            await a.step(FRAME)
        err = info.value
        assert (err.reason, err.session_id, err.frame) == ("step_failed", a.id, FRAME)
        assert isinstance(err.__cause__, RuntimeError)  # the step's own error, chained
        assert a.stats().num_tokens == tokens_before  # nothing was appended: safe to resend
        again = await a.step(err.frame)
        assert again.tokens and again.index == first.index + 2
        assert (await idle.step(FRAME)).tokens  # a session outside the failed tick never noticed
        stats = engine.stats()
        assert (stats.step_failures, stats.failed_ticks, stats.failed) == (2, 1, False)


async def test_repeated_step_failures_shut_the_engine_down_cleanly() -> None:
    engine = make_engine(reliability=ReliabilityConfig(step_retries=0, max_failed_ticks=2), faulty=True)
    before = set(engine_threads())
    async with engine:
        a, b = engine.try_session(), engine.try_session()
        await a.step(FRAME)
        faults(engine).fail_steps(1000)
        with pytest.raises(EngineStalled, match="step failed"):
            await a.step(FRAME)
        await a.send(FRAME)
        await b.send(FRAME)
        for s in (a, b):  # the second failure in a row: the frames' own errors, then the engine's
            with pytest.raises(EngineStalled) as info:
                await s.receive()
            assert info.value.reason in ("step_failed", "engine_failed")
        for s in (a, b):
            with pytest.raises(EngineStalled) as info:
                await s.receive()
            assert info.value.reason == "engine_failed"
            with pytest.raises(EngineStalled, match="make a new Engine"):
                await s.send(FRAME)  # later use says why, again
        assert engine.closed and engine.failure is not None
        assert isinstance(engine.failure.__cause__, RuntimeError)
        assert engine.stats().failed and engine.stats().sessions == 0
        assert engine.core.pool_stats().used_blocks == 0  # every block came back
        with pytest.raises(EngineStalled, match="shut down"):
            engine.try_session()
    assert set(engine_threads()) <= before  # the core thread was stopped and joined


async def test_a_session_with_non_finite_logits_is_broken_and_the_others_keep_their_beat() -> None:
    engine = make_engine(num_blocks=64, faulty=True)
    async with engine, engine.session() as a, engine.session() as bad, engine.session() as c:
        for s in (a, bad, c):
            await s.step(FRAME)
        faults(engine).poison(POISON)
        for s in (a, bad, c):
            await s.send(InputFrame.from_tokens([POISON]) if s is bad else FRAME)
        assert (await a.receive()).tokens
        with pytest.raises(SessionBroken) as info:
            await bad.receive()
        assert (info.value.reason, info.value.session_id) == ("numeric_fault", bad.id)
        assert (await c.receive()).tokens  # same tick as the corrupt session: served
        with pytest.raises(SessionBroken):
            await bad.send(FRAME)  # broken stays broken
        for _ in range(3):
            assert all([(await a.step(FRAME)).tokens, (await c.step(FRAME)).tokens])
        stats = engine.stats()
        assert (stats.broken, stats.sessions) == (1, 2)  # its admission slot is free again
        assert engine.core.pool_stats().used_blocks == a.stats().num_blocks + c.stats().num_blocks
        await bad.aclose()  # closing a broken session is harmless
    assert engine.core.pool_stats().used_blocks == 0


# no calibration (tick_tokens=None, a fixed cap): with no measured cost every long step is stuck, not slow
WATCHED = TimingConfig(period=0.001, deadline=0.02, max_chunk_tokens=8, tick_tokens=None)


async def test_the_watchdog_answers_a_stuck_step_at_once_and_the_engine_recovers() -> None:
    engine = make_engine(
        timing=WATCHED,
        reliability=ReliabilityConfig(watchdog=2.0, watchdog_floor=0.0, max_failed_ticks=1000),
        faulty=True,
    )
    async with engine, engine.session() as a, engine.session() as late:
        await a.step(FRAME)
        held = faults(engine).hold()
        await a.send(FRAME)
        with pytest.raises(EngineStalled) as info:
            await a.receive()
        # ordering, not timing: the error came while the step was still running
        assert held.entered.is_set() and not held.returned.is_set()
        assert (info.value.reason, info.value.frame) == ("step_stuck", FRAME)
        # a frame sent while the step is stuck is answered by the next watchdog round, not left waiting
        await late.send(FRAME)
        with pytest.raises(EngineStalled) as info:
            await late.receive()
        assert info.value.reason == "step_stuck" and not held.returned.is_set()
        assert engine.stats().stuck_steps == 1

        held.release.set()  # the step comes back: its result is kept, its output is not delivered twice
        await anyio.to_thread.run_sync(held.returned.wait, 10)
        out = await a.step(FRAME)
        assert out.tokens and out.index == 2
        assert (await late.step(FRAME)).tokens
        assert not engine.stats().failed


async def test_a_step_stuck_for_good_shuts_the_engine_down_and_abandons_its_thread() -> None:
    engine = make_engine(
        timing=WATCHED,
        reliability=ReliabilityConfig(watchdog=2.0, watchdog_floor=0.0, max_failed_ticks=3),
        faulty=True,
    )
    before = set(engine_threads())
    held = None
    try:
        async with engine, engine.session() as a, engine.session() as b:
            await a.step(FRAME)
            [thread] = set(engine_threads()) - before
            assert thread.daemon  # an abandoned thread never blocks process exit
            held = faults(engine).hold(forever=True)
            await a.send(FRAME)
            await b.send(FRAME)
            errors = []
            for s in (a, b):
                with pytest.raises(EngineStalled) as info:
                    await s.receive()
                errors.append(info.value.reason)
                with pytest.raises(EngineStalled) as info:
                    await s.receive()
                errors.append(info.value.reason)
            assert errors == ["step_stuck", "engine_failed"] * 2
            assert not held.returned.is_set()  # the engine gave up without waiting for the step
            assert engine.closed and engine.stats().failed
        # leaving `async with` did not wait for the stuck thread either
        assert thread.is_alive() and not held.returned.is_set()
    finally:
        if held is not None:
            held.release.set()  # let the thread finish, so that it exits
    thread.join(10)
    assert not thread.is_alive()


async def test_closing_the_engine_during_a_stuck_step_returns_without_the_step() -> None:
    engine = make_engine(
        timing=WATCHED,
        reliability=ReliabilityConfig(watchdog=2.0, watchdog_floor=0.0, max_failed_ticks=1000),
        faulty=True,
    )
    held = faults(engine).hold()
    try:
        async with engine:
            s = engine.try_session()
            await s.send(FRAME)
            await anyio.to_thread.run_sync(held.entered.wait, 10)
            await engine.aclose()  # waits for the watchdog to call the step stuck, not for the step
            assert not held.returned.is_set()  # abandoned, not waited for
            with pytest.raises(EngineClosed, match="engine was closed"):
                await s.receive()
    finally:
        held.release.set()
