"""No silent frames: a full pool is reported to the session it stalls, and nobody else loses data."""

from __future__ import annotations

import pytest

from metronome_engine import KVPolicy
from metronome_sdk import CacheExhausted, EngineError, EngineStalled, InputFrame, OutputFrame, Session, TickReport
from tests.sdk.conftest import make_engine

pytestmark = pytest.mark.timeout(60)

FRAME = InputFrame.from_tokens([11, 12, 13])  # with the fed-back output token: 4 tokens, one block a tick


async def stream_until_error(s: Session, outputs: list[OutputFrame], max_frames: int = 64) -> EngineError:
    for _ in range(max_frames):
        try:
            outputs.append(await s.step(FRAME))
        except EngineError as exc:
            return exc
    pytest.fail(f"session {s.id} never stalled in {max_frames} frames")


async def test_full_policy_stall_raises_engine_stalled_and_keeps_others_data() -> None:
    reports: list[TickReport] = []
    # 8 blocks of 4 tokens, the full policy: the pool fills after 8 session-ticks
    engine = make_engine(KVPolicy.full(), num_blocks=8, on_tick=reports.append)
    async with engine, engine.session() as quiet, engine.session() as talker:
        quiet_out = await quiet.step(FRAME)  # 3 tokens accepted for the quiet session
        outputs: list[OutputFrame] = []
        err = await stream_until_error(talker, outputs)

        assert type(err) is EngineStalled
        assert err.session_id == talker.id
        assert err.reason == "pool_exhausted"
        assert err.frame is FRAME  # handed back: nothing of it was appended
        assert len(outputs) == 7  # the quiet session holds one of the eight blocks
        assert all(out.tokens for out in [quiet_out, *outputs])  # never an empty frame as output
        assert [out.index for out in outputs] == list(range(7))

        # the quiet session's accepted tokens are still in the cache
        core = engine.core
        assert quiet.stats().num_tokens == 3
        assert core.pool_stats().used_blocks == quiet.stats().num_blocks + talker.stats().num_blocks
        assert talker.stats().num_tokens == 3 + 6 * 4  # 7 frames, 6 fed-back tokens between them

        stats = engine.stats()
        assert stats.stalls == 1
        assert stats.used_blocks == stats.pool_blocks == 8
        assert talker.stats().stalls == 1
        assert [r.stalled for r in reports if r.stalled] == [(talker.id,)]

        # the quiet session stalls too while the pool is full, then goes on once room returns
        with pytest.raises(EngineStalled):
            await quiet.step(FRAME)
        await talker.aclose()
        resumed = await quiet.step(FRAME)
        assert resumed.tokens
        assert quiet.stats().num_tokens == 3 + 1 + 3  # its context grew on from where it was
    assert engine.core.pool_stats().used_blocks == 0


async def test_a_session_the_pool_can_never_hold_gets_cache_exhausted() -> None:
    engine = make_engine(KVPolicy.full(), num_blocks=4)
    async with engine, engine.session() as s:
        outputs: list[OutputFrame] = []
        err = await stream_until_error(s, outputs)
        assert type(err) is CacheExhausted
        assert isinstance(err, EngineError)
        assert err.session_id == s.id
        assert err.pool_blocks == 4
        assert err.needed_blocks == 5
        assert len(outputs) == 4
        assert engine.stats().stalls == 1


async def test_window_soak_never_stalls_and_occupancy_stays_flat() -> None:
    used: list[int] = []
    engine = make_engine(
        KVPolicy.windowed(8, sinks=4), num_blocks=64, limit=8, on_tick=lambda r: used.append(r.used_blocks)
    )
    sessions, ticks = 8, 60
    async with engine:
        opened = [engine.try_session() for _ in range(sessions)]
        for _ in range(ticks):
            for s in opened:
                await s.send(FRAME)
            for s in opened:
                out = await s.receive()
                assert out.tokens
        stats = engine.stats()
        assert stats.stalls == 0
        assert stats.frames == sessions * ticks
        bound = engine.core.session_bound_blocks(chunk=8)
        assert bound is not None
        assert max(used) <= sessions * bound
        assert all(s.stats().num_tokens == 3 + (ticks - 1) * 4 for s in opened)  # every token was appended
        # flat: after the windows filled, occupancy neither grows nor drifts
        warm = used[len(used) // 2 :]
        assert max(warm) - min(warm) <= sessions
        assert max(warm) <= max(used[: len(used) // 2])
        for s in opened:
            await s.aclose()
        assert engine.stats().used_blocks == 0
        assert engine.core.pool_stats().used_blocks == 0
