"""A consumer that does not read: bounded outputs, shed or drop-oldest, and the others keep their beat."""

from __future__ import annotations

import anyio
import pytest

from metronome_sdk import Engine, InputFrame, LoadShed, Overloaded, ReliabilityConfig, Session
from tests.sdk.conftest import make_engine

pytestmark = pytest.mark.timeout(60)

FRAME = InputFrame.from_tokens([41, 42, 43])
QUEUE = 4


async def served(engine: Engine, s: Session, frames: int) -> None:
    """Wait (by event order, bounded) until ``frames`` of ``s``'s frames have been answered."""
    with anyio.fail_after(20):
        while s.stats().frames + s.stats().stalls < frames and not s.closed:
            await anyio.sleep(0)


async def test_a_session_that_leaves_outputs_unread_is_shed_and_its_outputs_so_far_stay_readable() -> None:
    engine = make_engine(limit=4, reliability=ReliabilityConfig(output_queue=QUEUE))
    async with engine, engine.session() as reader, engine.session() as deaf:
        for i in range(QUEUE + 1):  # one output more than the queue holds
            assert not deaf.closed
            await deaf.send(FRAME)
            out = await reader.step(FRAME)  # the reader keeps its beat throughout
            assert out.tokens and out.index == i
            await served(engine, deaf, i + 1)
        for i in range(QUEUE + 1, QUEUE + 4):
            assert (await reader.step(FRAME)).index == i
        assert deaf.closed and deaf.stats().unread_outputs <= QUEUE + 1  # bounded: the queue and the error
        got = [await deaf.receive() for _ in range(QUEUE)]
        assert [o.index for o in got] == list(range(QUEUE))  # nothing it was sent before the shed is lost
        with pytest.raises(LoadShed) as info:
            await deaf.receive()
        err = info.value
        assert isinstance(err, Overloaded) and err.session_id == deaf.id
        assert err.retry_after > 0 and err.limit == 4 and err.in_flight >= 1
        with pytest.raises(LoadShed):
            await deaf.send(FRAME)  # later use says why
        stats = engine.stats()
        assert (stats.shed, stats.sessions) == (1, 1)
        assert engine.core.pool_stats().used_blocks == reader.stats().num_blocks
        async with engine.session() as again:  # its slot went to a session that reads
            assert (await again.step(FRAME)).tokens


async def test_drop_oldest_keeps_the_latest_outputs_and_counts_the_rest() -> None:
    engine = make_engine(reliability=ReliabilityConfig(output_queue=QUEUE, slow_consumer="drop_oldest"))
    async with engine, engine.session() as s:
        sent = QUEUE + 5
        for i in range(sent):
            await s.send(FRAME)
            await served(engine, s, i + 1)
            assert s.stats().unread_outputs <= QUEUE
        got = [await s.receive() for _ in range(QUEUE)]
        assert [o.index for o in got] == list(range(sent - QUEUE, sent))  # the gap shows in the indexes
        assert s.stats().outputs_dropped == engine.stats().outputs_dropped == sent - QUEUE
        assert not s.closed and (await s.step(FRAME)).index == sent


def test_the_default_output_queue_is_bounded() -> None:
    config = ReliabilityConfig()
    assert config.slow_consumer == "shed" and 1 <= config.output_queue <= 1024
