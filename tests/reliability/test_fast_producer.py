"""A producer that sends faster than the metronome ticks: bounded input, a typed refusal, nothing lost."""

from __future__ import annotations

import anyio
import pytest

from metronome_sdk import InputFrame, InputQueueFull, Overloaded, ReliabilityConfig, TimingConfig
from tests.sdk.conftest import make_engine

pytestmark = pytest.mark.timeout(60)

FRAME = InputFrame.from_tokens([41, 42, 43])
QUEUE = 4
# slow ticks: a burst of sends lands between two of them
SLOW = TimingConfig(period=0.5, deadline=60.0, max_chunk_tokens=8)


async def test_a_burst_past_the_input_queue_is_refused_and_the_accepted_frames_are_all_answered() -> None:
    engine = make_engine(timing=SLOW, reliability=ReliabilityConfig(input_queue=QUEUE))
    async with engine, engine.session() as s:
        accepted = 0
        with pytest.raises(InputQueueFull) as info:
            for _ in range(QUEUE + 3):  # a tick may take one frame during the burst, not three
                s.send_nowait(FRAME)
                accepted += 1
        err = info.value
        # back-pressure on the frame, not on the session: its own Overloaded, with only retry_after
        assert isinstance(err, Overloaded) and not hasattr(err, "limit")
        assert err.session_id == s.id and err.retry_after == SLOW.period
        assert QUEUE <= accepted <= QUEUE + 2
        assert s.stats().queued_inputs == QUEUE and not s.closed
        got = [await s.receive() for _ in range(accepted)]
        assert [o.index for o in got] == list(range(accepted))  # every accepted frame, in order
        assert all(o.tokens for o in got)
        out = await s.step(FRAME)  # drained: sending works again
        assert out.index == accepted
        assert 'metronome_faults_total{kind="input_refused"} 1.0' in engine.metrics.text().decode()


async def test_the_input_bound_is_per_session() -> None:
    engine = make_engine(timing=SLOW, reliability=ReliabilityConfig(input_queue=QUEUE))
    async with engine, engine.session() as flood, engine.session() as calm:
        with pytest.raises(InputQueueFull):
            for _ in range(QUEUE + 3):
                flood.send_nowait(FRAME)
        assert (await calm.step(FRAME)).tokens  # the other session is not refused


async def test_send_waits_for_room_where_send_nowait_refuses() -> None:
    engine = make_engine(timing=SLOW, reliability=ReliabilityConfig(input_queue=QUEUE))
    async with engine, engine.session() as s:
        while s.stats().queued_inputs < QUEUE:
            s.send_nowait(FRAME)
        sent = s.stats().frames_sent
        index = await s.send(FRAME)  # waits for the next tick to take a frame, then queues
        assert index == sent and s.stats().queued_inputs <= QUEUE
        with anyio.move_on_after(0.01) as scope:  # cancelled while waiting: nothing was queued
            while True:
                await s.send(FRAME)
        assert scope.cancelled_caught
        got = [await s.receive() for _ in range(s.stats().frames_sent)]
        assert [o.index for o in got] == list(range(len(got)))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "64"])
def test_input_queue_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ValueError, match="input_queue"):
        ReliabilityConfig(input_queue=bad)  # type: ignore[arg-type]
