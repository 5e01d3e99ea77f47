"""A producer that sends faster than the metronome ticks: bounded input, a typed refusal, nothing lost."""

from __future__ import annotations

import pytest

from metronome_sdk import AdmissionRejected, InputFrame, LoadShed, Overloaded, ReliabilityConfig, TimingConfig
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
        with pytest.raises(Overloaded) as info:
            for _ in range(QUEUE + 3):  # a tick may take one frame during the burst, not three
                await s.send(FRAME)
                accepted += 1
        err = info.value
        # back-pressure on the frame, not on the session: neither refused at the door nor shed
        assert not isinstance(err, (AdmissionRejected, LoadShed))
        assert err.session_id == s.id and err.retry_after == SLOW.period and err.in_flight == 1
        assert QUEUE <= accepted <= QUEUE + 2
        assert len(s._queue) == QUEUE and not s.closed
        got = [await s.receive() for _ in range(accepted)]
        assert [o.index for o in got] == list(range(accepted))  # every accepted frame, in order
        assert all(o.tokens for o in got)
        out = await s.step(FRAME)  # drained: sending works again
        assert out.index == accepted
        assert engine.metrics.faults.labels("input_refused")._value.get() == 1


async def test_the_input_bound_is_per_session() -> None:
    engine = make_engine(timing=SLOW, reliability=ReliabilityConfig(input_queue=QUEUE))
    async with engine, engine.session() as flood, engine.session() as calm:
        with pytest.raises(Overloaded):
            for _ in range(QUEUE + 3):
                await flood.send(FRAME)
        assert (await calm.step(FRAME)).tokens  # the other session is not refused


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "64"])
def test_input_queue_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ValueError, match="input_queue"):
        ReliabilityConfig(input_queue=bad)  # type: ignore[arg-type]
