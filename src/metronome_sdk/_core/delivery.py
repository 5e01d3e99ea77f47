"""Applying outcomes: the answer, the stall error or the end a session's frame gets.

``outcome.classify`` decides what a step did for a frame; ``Delivery.apply`` acts on it: it
moves the session's KV numbers, builds the output frame or the typed error, counts it
(``Counters``) and hands it to the session's channel under the slow-consumer policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from metronome_engine import Stall

from .._codec import TextTokenizer
from .._config import ReliabilityConfig, TimingConfig
from .._exceptions import (
    CacheExhausted,
    DeadlineMissed,
    EngineStalled,
    LoadShed,
    MetronomeError,
    SessionBroken,
    StallReason,
)
from .._frames import OutputFrame
from .admission import Admitter
from .channel import QueuedFrame, ResultFate
from .counters import Counters, Fault
from .outcome import FrameChunk, Outcome, OutcomeKind
from .state import SessionState
from .step import StepResult

__all__: list[str] = []  # internal: Delivery, Delivered


@dataclass(frozen=True, slots=True)
class Delivered:
    latency: float | None = None  # the frame was answered this tick
    grown: int = 0  # blocks the session took in this step
    stalled: bool = False


def stall_message(reason: StallReason, *, used_blocks: int, pool_blocks: int) -> str:
    """Why a frame was not served, by reason: one sentence each, with what to do."""
    match reason:
        case StallReason.POOL_EXHAUSTED:
            return f"the KV pool is full ({used_blocks} of {pool_blocks} blocks); close sessions or use kv='window'"
        case StallReason.CONTEXT_LIMIT:
            return "the session reached the longest stream its backend can hold; open a new session or use kv='window'"
        case StallReason.STEP_FAILED | StallReason.STEP_STUCK | StallReason.ENGINE_FAILED:
            raise ValueError(f"{reason} is not a core's stall; its message names the fault")


class Delivery:
    def __init__(
        self,
        *,
        counters: Counters,
        timing: TimingConfig,
        reliability: ReliabilityConfig,
        admitter: Admitter,
        tokenizer: TextTokenizer | None,
        end_session: Callable[[SessionState, MetronomeError, Fault], bool],
        in_flight: Callable[[], int],
    ) -> None:
        self.counters = counters
        self.timing = timing
        self.reliability = reliability
        self.admitter = admitter
        self.tokenizer = tokenizer
        self._end_session = end_session
        self._in_flight = in_flight

    def apply(
        self,
        entry: FrameChunk,
        outcome: Outcome,
        *,
        tick: int,
        done: float,
        used_blocks: int,
        pool_blocks: int,
        cause: BaseException | None = None,
        tries: int = 0,
    ) -> Delivered:
        slot, pending = entry.slot, entry.pending
        match outcome.kind:
            case OutcomeKind.IGNORED:
                return Delivered()
            case OutcomeKind.STEP_FAILED:
                self._take(slot, pending)
                why = f"the step failed {tries} times ({cause!r}); nothing was appended"
                self.stalled(slot, pending, StallReason.STEP_FAILED, why, cause)
                return Delivered()
            case OutcomeKind.BROKEN:
                self._break(slot, pending)
                return Delivered()
            case OutcomeKind.LATE:
                # a stuck step that came back: its tokens are in the context, its frame was answered
                slot.num_tokens, slot.num_blocks = outcome.num_tokens, outcome.num_blocks
                slot.reply_withdrawn()  # its output was never delivered, so the model does not see it
                return Delivered()
            case OutcomeKind.STALLED | OutcomeKind.CACHE_EXHAUSTED:
                return self._stall(entry, outcome, tick, done, used_blocks, pool_blocks)
            case OutcomeKind.APPENDED | OutcomeKind.ANSWERED:
                grown = outcome.num_blocks - slot.num_blocks
                self._remember(entry, outcome.num_tokens)
                slot.num_tokens, slot.num_blocks = outcome.num_tokens, outcome.num_blocks
                slot.reply_appended()
                del pending.tokens[: entry.taken]
                pending.started = True
                if outcome.kind is OutcomeKind.APPENDED:
                    return Delivered(grown=grown)
                self._take(slot, pending)
                latency, put = self.answer(slot, pending, outcome.tokens, tick, done)
                if (
                    put is not ResultFate.DISCARDED
                ):  # a withdrawn reply is not fed back: the context keeps what was delivered
                    slot.reply_delivered(outcome.tokens[-1], pending.index)
                return Delivered(latency=latency, grown=grown)

    def _remember(self, entry: FrameChunk, num_tokens: int) -> None:
        """Keep the account of what the session's model still sees (docs/sessions.md): say
        when the window drops a whole turn or the system prompt, count every token it drops."""
        slot, pending = entry.slot, entry.pending
        memory = slot.memory
        if memory is None:
            return
        # a frame with input begins its turn after the fed-back token; an empty frame carries only
        # context's last token (a prompt's, or a turn's given with Session.append): no turn of its own
        if not pending.started and entry.taken and pending.frame.kind != "empty":
            memory.turn_started(slot.num_tokens + len(entry.tokens) - entry.taken)
        lost = memory.update(num_tokens)
        if lost.tokens:
            self.counters.evicted(lost.tokens)
        if lost.turns or lost.prompt:
            slot.log.info(
                "session.evicted",
                evicted_tokens=memory.evicted_tokens,
                turns_lost=lost.turns,
                oldest_resident_turn=memory.oldest_resident_turn,
                system_prompt_resident=memory.prompt_resident,
            )

    @staticmethod
    def _take(slot: SessionState, pending: QueuedFrame) -> None:
        inputs = slot.channel.inputs
        if inputs and inputs[0] is pending:
            inputs.popleft()
            slot.channel.input_taken()

    def answer(
        self, slot: SessionState, pending: QueuedFrame, tokens: tuple[int, ...], tick: int, done: float
    ) -> tuple[float, ResultFate]:
        latency = done - pending.submitted
        deadline = self.timing.frame_deadline
        missed = latency > deadline
        tok = self.tokenizer
        out = OutputFrame(
            session_id=slot.session_id,
            index=pending.index,
            tick=tick,
            tokens=tokens,
            text=tok.decode(list(tokens)) if tok is not None and tokens else "",
            latency=latency,
            deadline_missed=missed,
            stop=tok is not None and any(t in tok.stop_ids for t in tokens),
        )
        self.counters.frame(slot.channel.counts, latency, missed=missed)
        self.admitter.observe(latency)
        if missed and self.timing.strict:
            late = DeadlineMissed(
                f"frame {pending.index} of session {slot.session_id} took {latency * 1e3:.1f} ms, "
                f"past its {deadline * 1e3:.1f} ms deadline",
                session_id=slot.session_id,
                latency=latency,
                deadline=deadline,
                output=out,
            )
            return latency, self.push(slot, pending.index, late)
        return latency, self.push(slot, pending.index, out)

    def _stall(
        self, entry: FrameChunk, outcome: Outcome, tick: int, done: float, used_blocks: int, pool_blocks: int
    ) -> Delivered:
        """The pool (or the backend) could not take this chunk: nothing was appended. Tell the session."""
        slot, pending = entry.slot, entry.pending
        self._take(slot, pending)  # the frame is handed back in the error; the session may send it again
        self.counters.stall(slot.channel.counts)
        reason = outcome.reason
        assert reason is not None
        exhausted = outcome.kind is OutcomeKind.CACHE_EXHAUSTED
        slot.log.warning(
            "session.stalled",
            reason=reason.value,
            tick=tick,
            frame=pending.index,
            num_tokens=outcome.num_tokens,
            used_blocks=used_blocks,
            pool_blocks=pool_blocks,
            cache_exhausted=exhausted,
        )
        sid = slot.session_id
        if exhausted:
            n = outcome.num_tokens + len(entry.tokens)
            error: MetronomeError = CacheExhausted(
                f"session {sid} needs {outcome.needed_blocks} blocks for {n} tokens, more than the pool's "
                f"{pool_blocks}; grow the pool or use kv='window' to bound each session",
                session_id=sid,
                needed_blocks=outcome.needed_blocks,
                pool_blocks=pool_blocks,
            )
        else:
            why = stall_message(reason, used_blocks=used_blocks, pool_blocks=pool_blocks)
            error = EngineStalled(
                f"frame {pending.index} of session {sid} was not served: {why}",
                session_id=sid,
                reason=reason,
                frame=pending.frame,
            )
        self.push(slot, pending.index, error)
        return Delivered(stalled=True)

    def stalled(
        self,
        slot: SessionState,
        pending: QueuedFrame,
        reason: StallReason,
        why: str,
        cause: BaseException | None = None,
    ) -> None:
        """A fault (failed or stuck step) left ``pending`` unserved: hand it back in an ``EngineStalled``."""
        self.counters.stall(slot.channel.counts)
        err = EngineStalled(
            f"frame {pending.index} of session {slot.session_id} was not served: {why}",
            session_id=slot.session_id,
            reason=reason,
            frame=pending.frame,
        )
        err.__cause__ = cause
        slot.log.warning("session.stalled", reason=reason.value, frame=pending.index)
        self.push(slot, pending.index, err)

    def prompt_broken(self, slot: SessionState) -> None:
        """Non-finite logits while the system prompt was prefilled ahead of any frame."""
        self._break(slot, None)

    def _break(self, slot: SessionState, pending: QueuedFrame | None) -> None:
        """Non-finite logits: the session's state is corrupt. The core dropped it; end the session."""
        slot.seq_id = None  # the core freed the sequence (and scrubbed its blocks) already
        slot.num_blocks = 0
        index = pending.index if pending is not None else None
        slot.log.error("session.broken", reason="numeric_fault", frame=index)
        where = f"at frame {index}" if index is not None else "in its system prompt"
        self._end_session(
            slot,
            SessionBroken(
                f"session {slot.session_id} is broken: its logits came out NaN or inf {where}, so "
                "its cache is corrupt; the engine dropped it and freed its blocks; open a new session",
                session_id=slot.session_id,
                reason="numeric_fault",
            ),
            Fault.NUMERIC_FAULT,
        )

    # the slow-consumer policy ----------------------------------------------------------------------

    def push(self, slot: SessionState, index: int | None, item: OutputFrame | BaseException) -> ResultFate:
        """Hand ``item`` to the session within its bounded output queue; shed a session that does not read."""
        channel = slot.channel
        put = channel.put(index, item)
        if put is ResultFate.DROPPED_OLDEST:
            dropped = channel.counts.outputs_dropped + 1
            self.counters.output_dropped(channel.counts)
            cap = self.reliability.output_queue
            if dropped == 1 or dropped % cap == 0:  # a slow reader is one event per queue-full, not per frame
                slot.log.warning("session.outputs_dropped", dropped=dropped, output_queue=cap)
        elif put is ResultFate.OVERFLOW:
            cap = self.reliability.output_queue
            self.shed(
                slot,
                f"session {slot.session_id} was shed: it left {cap} outputs unread (ReliabilityConfig.output_queue); "
                "read outputs as they come, or use slow_consumer='drop_oldest'; open a new session after retry_after",
            )
        return put

    def shed(self, slot: SessionState, message: str) -> None:
        """End ``slot``'s session with ``LoadShed`` to protect the others."""
        shed = LoadShed(
            message,
            retry_after=self.admitter.retry_after(),
            limit=self.admitter.limit,
            in_flight=self._in_flight(),
            session_id=slot.session_id,
        )
        self._end_session(slot, shed, Fault.SHED)


# context appended ahead of the frames ------------------------------------------------------------


def apply_context_ahead(
    prefills: list[tuple[SessionState, int]], result: StepResult, first: int, delivery: Delivery
) -> None:
    """``prefills[j]`` (a session, the prompt tokens it appended) is the step's work ``first + j``."""
    for j, (slot, n) in enumerate(prefills):
        slot.seq_id = result.seq_ids[first + j]  # opened by this step: freed with the session
        if result.error is not None:
            continue  # nothing appended: tried again next tick, and the failed tick is counted
        out = result.outputs[first + j]
        if out.stall is Stall.NUMERIC_FAULT:
            delivery.prompt_broken(slot)  # the core dropped its sequence
            continue
        if out.stall is not None:
            slot.context_to_first_frame()
            slot.channel.context_appended()  # an append() waiting on it returns: the frame reports the stall
            continue
        slot.context_appended(n)
        slot.num_tokens, slot.num_blocks = out.num_tokens, out.num_blocks
        if slot.memory is not None:
            slot.memory.update(out.num_tokens)
        slot.channel.context_appended()
