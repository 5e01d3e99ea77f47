"""``classify``: what a step did for a frame, decided without a model (a pure function)."""

from __future__ import annotations

import pytest

from metronome_engine import PoolStats, Stall, StepOutput
from metronome_sdk import InputFrame, StallReason
from metronome_sdk._core.channel import ChannelState, QueuedFrame, SessionChannel
from metronome_sdk._core.outcome import FrameChunk, OutcomeKind, StepFailed, classify, stall_reason
from metronome_sdk._core.state import SessionState

POOL = PoolStats(num_blocks=8, used_blocks=8, block_size=4, sequences=2)


def entry(
    *, finishes: bool = True, answered: bool = False, state: ChannelState = ChannelState.OPEN, chunk: int = 3
) -> FrameChunk:
    channel = SessionChannel(1, input_queue=4, output_queue=4, drop_oldest=False)
    channel.state = state
    pending = QueuedFrame(InputFrame.from_tokens([5] * chunk), [5] * chunk, submitted=0.0, index=0)
    return FrameChunk(SessionState(1, channel, None, None), pending, [5] * chunk, chunk, finishes, answered)


def out(*, token: int | None = 7, stall: Stall | None = None, num_tokens: int = 3, num_blocks: int = 1) -> StepOutput:
    return StepOutput(1, token=token, stall=stall, num_tokens=num_tokens, num_blocks=num_blocks)


async def test_a_served_frame_is_answered_with_its_token_and_a_partial_chunk_is_appended() -> None:
    done = classify(entry(), out(), pool=POOL, bounded=True)
    assert (done.kind, done.tokens, done.num_tokens, done.num_blocks) == (OutcomeKind.ANSWERED, (7,), 3, 1)
    assert classify(entry(finishes=False), out(token=None), pool=POOL, bounded=True).kind is OutcomeKind.APPENDED
    # extra decode rounds: the frame's tokens are all it decoded this tick, the output the last step's
    several = classify(entry(), out(token=9), pool=POOL, bounded=True, decoded=(7, 8, 9))
    assert several.tokens == (7, 8, 9)


async def test_a_full_pool_stalls_a_bounded_session_and_a_session_past_the_pool_is_a_sizing_error() -> None:
    stalled = classify(entry(), out(token=None, stall=Stall.POOL_EXHAUSTED), pool=POOL, bounded=True)
    assert (stalled.kind, stalled.reason) == (OutcomeKind.STALLED, StallReason.POOL_EXHAUSTED)
    # unbounded, and 30 + 3 tokens need 9 blocks of 4, more than the pool's 8: no wait will help
    grown = out(token=None, stall=Stall.POOL_EXHAUSTED, num_tokens=30)
    exhausted = classify(entry(), grown, pool=POOL, bounded=False)
    assert (exhausted.kind, exhausted.needed_blocks) == (OutcomeKind.CACHE_EXHAUSTED, 9)
    fits = classify(entry(), out(token=None, stall=Stall.POOL_EXHAUSTED, num_tokens=20), pool=POOL, bounded=False)
    assert fits.kind is OutcomeKind.STALLED  # 23 tokens fit in 6 blocks: load, not sizing


async def test_the_context_limit_is_its_own_reason_not_a_full_pool() -> None:
    limited = classify(entry(), out(token=None, stall=Stall.CONTEXT_LIMIT), pool=POOL, bounded=False)
    assert (limited.kind, limited.reason) == (OutcomeKind.STALLED, StallReason.CONTEXT_LIMIT)


async def test_non_finite_logits_break_the_session_whatever_else_happened() -> None:
    for e in (entry(), entry(answered=True), entry(state=ChannelState.ENDED)):
        assert (
            classify(e, out(token=None, stall=Stall.NUMERIC_FAULT), pool=POOL, bounded=True).kind is OutcomeKind.BROKEN
        )


async def test_a_failed_step_stalls_the_frame_unless_it_was_answered_or_the_session_is_gone() -> None:
    failed = StepFailed(RuntimeError("device"), tries=2)
    got = classify(entry(), failed, pool=POOL, bounded=True)
    assert (got.kind, got.reason) == (OutcomeKind.STEP_FAILED, StallReason.STEP_FAILED)
    assert classify(entry(answered=True), failed, pool=POOL, bounded=True).kind is OutcomeKind.IGNORED
    assert classify(entry(state=ChannelState.ENDED), failed, pool=POOL, bounded=True).kind is OutcomeKind.IGNORED


@pytest.mark.parametrize("state", [ChannelState.CLOSED, ChannelState.ENGINE_CLOSED])
async def test_a_session_closed_while_its_step_ran_is_left_to_its_closer(state: ChannelState) -> None:
    for result in (out(), out(token=None, stall=Stall.NUMERIC_FAULT), StepFailed(RuntimeError(), 1)):
        assert classify(entry(state=state), result, pool=POOL, bounded=True).kind is OutcomeKind.IGNORED


async def test_a_stuck_step_that_returns_keeps_its_state_but_not_its_answer() -> None:
    late = classify(entry(answered=True), out(num_tokens=9, num_blocks=3), pool=POOL, bounded=True)
    assert (late.kind, late.num_tokens, late.num_blocks) == (OutcomeKind.LATE, 9, 3)
    stalled_late = out(token=None, stall=Stall.POOL_EXHAUSTED)
    assert classify(entry(answered=True), stalled_late, pool=POOL, bounded=True).kind is OutcomeKind.IGNORED


def test_every_core_stall_maps_to_a_reason_or_to_a_broken_session() -> None:
    mapped = {stall: stall_reason(stall) for stall in Stall}
    assert mapped == {
        Stall.POOL_EXHAUSTED: StallReason.POOL_EXHAUSTED,
        Stall.CONTEXT_LIMIT: StallReason.CONTEXT_LIMIT,
        Stall.NUMERIC_FAULT: None,
    }


async def test_a_sampled_frame_without_a_token_is_a_core_bug_said_loudly() -> None:
    with pytest.raises(RuntimeError, match="sampled no token"):
        classify(entry(), out(token=None), pool=POOL, bounded=True)
