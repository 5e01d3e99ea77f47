"""Many sessions opening at once race the admission cap and the memory guard: never more than the guard allows."""

from __future__ import annotations

import asyncio

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metronome_engine import EngineCore, KVPolicy
from metronome_sdk import AdmissionConfig, AdmissionRejected, Engine, InputFrame, TimingConfig
from tests.engine.tiny import tiny_engine
from tests.sdk.conftest import FakeClock

pytestmark = pytest.mark.timeout(180)

FRAME = InputFrame.from_tokens([51, 52])
_cores: dict[int, EngineCore] = {}


def core_for(sessions_that_fit: int) -> EngineCore:
    """A pool that holds exactly ``sessions_that_fit`` bounded sessions (window 8 + 4 sinks, chunk 8)."""
    if sessions_that_fit not in _cores:
        policy = KVPolicy.windowed(8, sinks=4)
        bound = policy.max_blocks(4, chunk=8)
        assert bound is not None
        _cores[sessions_that_fit] = tiny_engine(policy, num_blocks=bound * sessions_that_fit + bound - 1)
    return _cores[sessions_that_fit]


task = st.fixed_dictionaries(
    {
        "before": st.integers(0, 6),  # checkpoints before opening
        "nowait": st.booleans(),  # try_session, or wait for room
        "frames": st.integers(0, 2),  # frames stepped while admitted
        "hold": st.integers(0, 6),  # checkpoints held open
    }
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tasks=st.lists(task, min_size=2, max_size=24),
    fit=st.integers(1, 4),
    cap=st.integers(1, 6),
    wait=st.sampled_from([0.0, 0.01]),
)
def test_concurrent_opens_never_exceed_the_cap_or_the_memory_guard(
    tasks: list[dict[str, int]], fit: int, cap: int, wait: float
) -> None:
    allowed = min(fit, cap)

    async def run() -> None:
        engine = Engine(
            core=core_for(fit),
            # a fixed tick budget and cap: nothing to calibrate, so each example starts at once
            timing=TimingConfig(period=0.001, deadline=60.0, max_chunk_tokens=8, tick_tokens=64),
            admission=AdmissionConfig(initial_limit=cap, max_limit=cap, queue_timeout=wait),
            clock=FakeClock(),  # no AIMD decision moves the cap mid-race
        )
        inside = 0
        peak = 0
        admitted = rejected = 0

        async def one(spec: dict[str, int]) -> None:
            nonlocal inside, peak, admitted, rejected
            for _ in range(spec["before"]):
                await anyio.lowlevel.checkpoint()
            try:
                s = engine.try_session() if spec["nowait"] else await engine.session(timeout=wait).open()
            except AdmissionRejected as exc:
                rejected += 1
                assert exc.limit <= allowed and exc.in_flight <= allowed
                return
            admitted += 1
            inside += 1
            peak = max(peak, inside)
            assert engine.stats().sessions <= allowed
            try:
                for _ in range(spec["frames"]):
                    assert (await s.step(FRAME)).tokens
                for _ in range(spec["hold"]):
                    await anyio.lowlevel.checkpoint()
                    assert engine.stats().sessions <= allowed
            finally:
                inside -= 1
                await s.aclose()

        async with engine:
            async with anyio.create_task_group() as tg:
                for spec in tasks:
                    tg.start_soon(one, spec)
            assert peak <= allowed
            assert admitted >= 1 and admitted + rejected == len(tasks)
            assert engine.stats().admitted == admitted and engine.stats().rejected == rejected
            assert engine.core.pool_stats().used_blocks <= engine.core.pool.num_blocks
        assert engine.core.pool_stats().used_blocks == 0

    asyncio.run(run())
