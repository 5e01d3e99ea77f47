"""``SilentBackend``: the legacy behaviour of serving engines, as a backend the benchmark wraps around a core.

A serving engine whose KV pool is full answers the request on time with nothing, so every
latency metric stays green while the conversation goes silent (the *silent cliff*). The SDK
refuses to do that (a stall is an ``EngineStalled``); ``bench cliff --silent`` shows what it
looks like by putting this wrapper between the SDK and the engine core: a stalled session's
output comes back as an answer carrying the one token ``SILENCE`` (an id outside every
vocabulary), nothing of its input is appended, and the SDK answers the frame on time. What the
SDK cannot see, the wrapper keeps: the stalls it hid, handed to each ``TickReport`` by
``report``. It hides every stall, those of the engine's calibration at start too (a few steps
over eight throwaway sequences, which skips a stalled step): give the pool room for that.
Never use it in an application.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from metronome_engine import EngineBackend, SamplingParams, Stall, StepOutput, StepRequest
from metronome_engine.backend import PassThroughBackend
from metronome_sdk import OutputFrame, TickReport

__all__ = ["SILENCE", "SilentBackend", "is_silence"]

SILENCE = -1  # the token of a silenced answer: no model has it, so no real output is mistaken for silence

# what a serving engine hides; a numeric fault still breaks the session (the state is corrupt)
_HIDDEN = (Stall.POOL_EXHAUSTED, Stall.CONTEXT_LIMIT)


def is_silence(out: OutputFrame) -> bool:
    """The frame was answered with silence by a ``SilentBackend`` (its session was stalled)."""
    return out.tokens == (SILENCE,)


class SilentBackend(PassThroughBackend):
    """Wraps an ``EngineBackend``; a stalled session is answered with ``SILENCE`` instead of a stall."""

    def __init__(self, core: EngineBackend) -> None:
        super().__init__(core)
        self.hidden = 0  # stalls hidden so far
        self._since_report: list[int] = []  # seq ids stalled since the last TickReport
        self._length: dict[int, tuple[int, int]] = {}  # seq id -> (tokens, blocks) after its last step

    def report(self, tick: TickReport) -> TickReport:
        """``tick`` with the stalls hidden since the last report as its ``stalled`` (the core's sequence
        ids, not session ids: the SDK never saw them). Wrap ``Engine(on_tick=...)`` with it."""
        stalled, self._since_report = tuple(self._since_report), []
        return replace(tick, stalled=tick.stalled + stalled)

    # EngineBackend (the rest passes through) ----------------------------------------------------

    def add_sequence(self, *, sampling: SamplingParams | None = None) -> int:
        seq_id = super().add_sequence(sampling=sampling)
        self._length[seq_id] = (0, 0)
        return seq_id

    def free_sequence(self, seq_id: int) -> None:
        self._length.pop(seq_id, None)
        super().free_sequence(seq_id)

    def step(self, requests: Sequence[StepRequest]) -> list[StepOutput]:
        # a silenced answer fed back is not the model's token: an empty answer feeds nothing back
        heard = [replace(r, tokens=[t for t in r.tokens if t != SILENCE]) for r in requests]
        served = self.core.step([r for r in heard if r.tokens]) if any(r.tokens for r in heard) else []
        by_seq = {out.seq_id: out for out in served}
        outputs = []
        for req in heard:
            out = by_seq.get(req.seq_id)
            if out is not None and out.stall not in _HIDDEN:
                self._length[req.seq_id] = (out.num_tokens, out.num_blocks)
                outputs.append(out)
                continue
            # stalled (or nothing to append): on time, with nothing in it, as a serving engine answers
            tokens, blocks = self._length.get(req.seq_id, (0, 0))
            if out is not None:
                self.hidden += 1
                self._since_report.append(req.seq_id)
                tokens, blocks = out.num_tokens, out.num_blocks
            token = SILENCE if req.sample else None
            outputs.append(StepOutput(req.seq_id, token=token, num_tokens=tokens, num_blocks=blocks))
        return outputs
