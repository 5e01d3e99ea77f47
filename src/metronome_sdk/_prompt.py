"""Context appended ahead of a session's frames: system prompts prefilled as their sessions
open (``TimingConfig.prompt_at_open``), and turns given with ``Session.append``.

The tick loop appends that context, all but its last token, with the tick budget's tokens
before the session's next frame; the frame then carries only its own input (and the
context's last token, so that an empty frame still has a token to go on from). This module
applies what a tick's step did to that context.
"""

from __future__ import annotations

from metronome_engine import Stall

from ._delivery import Delivery
from ._dispatch import WorkResult
from ._state import Slot

__all__: list[str] = []  # internal: prompts_prefilled


def prompts_prefilled(prefills: list[tuple[Slot, int]], result: WorkResult, first: int, delivery: Delivery) -> None:
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
            _with_first_frame(slot)
            slot.channel.context_appended()  # an append() waiting on it returns: the frame reports the stall
            continue
        del slot.prefill[:n]
        slot.num_tokens, slot.num_blocks = out.num_tokens, out.num_blocks
        if slot.memory is not None:
            slot.memory.update(out.num_tokens)
        slot.channel.context_appended()


def _with_first_frame(slot: Slot) -> None:
    """No room now: the rest of the context goes with the next frame, whose step reports the stall as usual."""
    rest, slot.prefill = slot.prefill, []
    inputs = slot.channel.inputs
    if inputs and not inputs[0].started:
        inputs[0].tokens[:0] = rest
        inputs[0].prefix += len(rest)  # handed back with it if it is withdrawn
    else:
        slot.prefix[:0] = rest
