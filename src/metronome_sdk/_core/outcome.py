"""What a step's result means for one session's frame: ``classify(entry, output) -> Outcome``.

Pure: it reads the entry and the core's output and changes nothing, so every branch is
tested without a model (tests/sdk/core/test_outcome.py). ``delivery.py`` applies the outcome.
The core's stall reasons are mapped to the SDK's here, exhaustively, in one place.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import assert_never

from metronome_engine import PoolStats, Stall, StepOutput

from .._exceptions import StallReason
from .channel import ChannelState, QueuedFrame
from .state import SessionState

__all__: list[str] = []  # internal: FrameChunk, StepFailed, Outcome, OutcomeKind, classify


@dataclass(slots=True, eq=False)
class FrameChunk:
    """One session's part of one tick."""

    slot: SessionState
    pending: QueuedFrame
    tokens: list[int]  # the chunk: the feedback token (if any), then up to the budget of the frame's tokens
    taken: int  # of pending.tokens
    finishes: bool  # the frame's last token is in this chunk: sample its output
    answered: bool = False  # the watchdog already answered this frame (a stuck step)
    decode: int = 1  # tokens to decode for the frame this tick (the budget's grant), when it finishes


@dataclass(frozen=True, slots=True)
class StepFailed:
    """The step raised on every try; nothing was appended for anyone."""

    error: BaseException
    tries: int


class OutcomeKind(enum.Enum):
    IGNORED = "ignored"  # the session was closed while its step ran (its closer frees the sequence)
    STEP_FAILED = "step_failed"  # nothing appended; the frame is handed back
    BROKEN = "broken"  # non-finite logits: the core dropped the sequence
    LATE = "late"  # the watchdog answered the frame already: keep the KV state, discard the output
    STALLED = "stalled"  # nothing appended (``reason``); the frame is handed back
    CACHE_EXHAUSTED = "cache_exhausted"  # the pool can never hold this session
    APPENDED = "appended"  # one chunk of a longer frame appended; more ticks to come
    ANSWERED = "answered"  # the frame's last chunk appended and its output token sampled


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: OutcomeKind
    reason: StallReason | None = None
    tokens: tuple[int, ...] = ()  # ANSWERED: the tokens decoded for the frame (LATE: for the stuck one)
    num_tokens: int = 0  # the session's stream length after the step
    num_blocks: int = 0  # blocks it holds after the step
    needed_blocks: int = 0  # CACHE_EXHAUSTED: blocks its stream needs


def stall_reason(stall: Stall) -> StallReason | None:
    """The SDK's reason for a core's stall; ``None`` for a numeric fault (the session is broken, not stalled)."""
    match stall:
        case Stall.POOL_EXHAUSTED:
            return StallReason.POOL_EXHAUSTED
        case Stall.CONTEXT_LIMIT:
            return StallReason.CONTEXT_LIMIT
        case Stall.NUMERIC_FAULT:
            return None
        case _:
            assert_never(stall)


def classify(
    entry: FrameChunk, output: StepOutput | StepFailed, *, pool: PoolStats, bounded: bool, decoded: tuple[int, ...] = ()
) -> Outcome:
    """What the step did for ``entry``. ``bounded``: every session's KV is bounded (a window policy).

    ``output`` is the session's last step output of the tick; ``decoded`` the tokens it decoded
    (several with extra decode rounds; by default the output's one token).
    """
    if not decoded and isinstance(output, StepOutput) and output.token is not None:
        decoded = (output.token,)
    state = entry.slot.channel.state
    if state is ChannelState.CLOSED or state is ChannelState.ENGINE_CLOSED:
        return Outcome(OutcomeKind.IGNORED)
    if isinstance(output, StepFailed):
        if entry.answered or state is not ChannelState.OPEN:
            return Outcome(OutcomeKind.IGNORED)
        return Outcome(OutcomeKind.STEP_FAILED, reason=StallReason.STEP_FAILED)
    if output.stall is Stall.NUMERIC_FAULT:
        return Outcome(OutcomeKind.BROKEN, num_tokens=output.num_tokens)
    if state is not ChannelState.OPEN:
        return Outcome(OutcomeKind.IGNORED)  # ended by the engine in this tick (shed): freed after it
    if entry.answered:
        if output.stall is None:
            return Outcome(OutcomeKind.LATE, tokens=decoded, num_tokens=output.num_tokens, num_blocks=output.num_blocks)
        return Outcome(OutcomeKind.IGNORED)
    if output.stall is not None:
        reason = stall_reason(output.stall)
        assert reason is not None  # the numeric fault was handled above
        if reason is StallReason.POOL_EXHAUSTED:
            needed = math.ceil((output.num_tokens + len(entry.tokens)) / pool.block_size)
            if not bounded and needed > pool.num_blocks:
                return Outcome(
                    OutcomeKind.CACHE_EXHAUSTED, reason=reason, num_tokens=output.num_tokens, needed_blocks=needed
                )
        return Outcome(OutcomeKind.STALLED, reason=reason, num_tokens=output.num_tokens, num_blocks=output.num_blocks)
    if not entry.finishes:
        return Outcome(OutcomeKind.APPENDED, num_tokens=output.num_tokens, num_blocks=output.num_blocks)
    if not decoded:
        raise RuntimeError(f"the engine core sampled no token for seq_id={output.seq_id}, though asked to")
    return Outcome(OutcomeKind.ANSWERED, tokens=decoded, num_tokens=output.num_tokens, num_blocks=output.num_blocks)
