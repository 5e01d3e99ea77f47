"""``FaultyBackend``: an ``EngineBackend`` that wraps a real one and injects faults on demand.

As httpx's ``MockTransport`` stands in for the network, this stands between the SDK and the
engine core: every call goes to the real core unless a fault is armed. Faults: steps that raise
(``fail_steps``), a step that hangs until released (``hold``), and a session whose logits come
out non-finite (``poison``), which it reports the way a real core does: the sequence dropped,
its blocks freed, ``Stall.NUMERIC_FAULT`` in its output.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace

from metronome_engine import EngineBackend, Stall, StepOutput, StepRequest
from metronome_engine.backend import PassThroughBackend

__all__ = ["FaultyBackend", "Hold"]


class Hold:
    """A hung step: ``entered`` when it starts, blocks until ``release``, ``returned`` after."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.returned = threading.Event()


class FaultyBackend(PassThroughBackend):
    def __init__(self, core: EngineBackend) -> None:
        super().__init__(core)
        self.calls = 0  # step calls, faulty ones included
        self._fail = 0
        self._hold: Hold | None = None
        self._hold_forever = False
        self._poison: set[int] = set()  # a request carrying one of these tokens comes out non-finite

    # arming faults -------------------------------------------------------------------------------

    def fail_steps(self, n: int) -> None:
        """The next ``n`` step calls raise ``RuntimeError`` (having changed nothing, as a real fault would)."""
        self._fail = n

    def hold(self, *, forever: bool = False) -> Hold:
        """The next step (every step, with ``forever``) hangs until ``release`` is set."""
        self._hold = Hold()
        self._hold_forever = forever
        return self._hold

    def heal(self) -> None:
        self._fail, self._hold, self._poison = 0, None, set()

    def poison(self, token: int) -> None:
        """The session whose next request carries ``token`` gets non-finite logits."""
        self._poison.add(token)

    # EngineBackend (the rest passes through) ----------------------------------------------------

    def step(self, requests: Sequence[StepRequest]) -> list[StepOutput]:
        self.calls += 1
        hold = self._hold
        if hold is not None:
            if not self._hold_forever:
                self._hold = None
            hold.entered.set()
            hold.release.wait(30)
        try:
            if self._fail > 0:
                self._fail -= 1
                raise RuntimeError("injected: the device fell over")
            poisoned = {r.seq_id for r in requests if self._poison.intersection(r.tokens)}
            outputs = super().step(requests)
            for i, out in enumerate(outputs):
                if out.seq_id in poisoned:
                    self.core.free_sequence(out.seq_id)  # a real core drops a corrupt sequence itself
                    outputs[i] = replace(out, token=None, stall=Stall.NUMERIC_FAULT, num_blocks=0)
            return outputs
        finally:
            if hold is not None:
                hold.returned.set()
