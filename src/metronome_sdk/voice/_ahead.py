"""Answering ahead: a turn answered at a pause, before the turn detector is sure the caller is done.

At a short pause the caller's words so far are already transcribed (hearing ahead); the agent
can also start the answer then: the session appends the turn and decodes up to its first
clause, and the voice speaks it, while the turn detector still waits out its silence. Nothing
reaches the caller yet: the events are held, the speech waits. If the turn ends there, the
held events go out and the speech with them, so the turn's end is the only wait left. If the
caller goes on, the answer is withdrawn: the session goes back to its mark
(``Session.rewind``), exactly as if the turn had never been appended, and nothing was sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio

from .._session import ContextMark
from ..transports._base import Event, Transport

__all__: list[str] = []  # internal: the VoiceAgent's

MARGIN = 16  # tokens a tentative answer keeps in hand beyond its turn: the chat template, the first frame


@dataclass(slots=True, eq=False)
class Ahead:
    """One tentative answer: which pause it answers, its mark, and what it holds back."""

    key: tuple[int, int]  # (utterance, samples): the speech it answers, up to the pause
    settled: anyio.Event = field(default_factory=anyio.Event)  # confirmed or withdrawn
    confirmed: bool = False
    mark: ContextMark | None = None  # the session's context before the turn went in
    held: list[Event] = field(default_factory=list)  # events kept back until it is confirmed
    flushed: bool = False
    lock: anyio.Lock = field(default_factory=anyio.Lock)  # held events go out once, in order

    def confirm(self) -> None:
        self.confirmed = True
        self.settled.set()

    def withdraw(self) -> None:
        self.settled.set()

    @property
    def withdrawn(self) -> bool:
        return self.settled.is_set() and not self.confirmed

    async def send(self, transport: Transport, event: Event) -> None:
        """Send ``event`` once the answer is confirmed (held until then, dropped if withdrawn)."""
        if not self.confirmed:
            self.held.append(event)
            return
        await self.flush(transport)
        await transport.send_event(event)

    async def flush(self, transport: Transport) -> None:
        """The answer is confirmed: the events held back go out, in the order they were made."""
        async with self.lock:
            if self.flushed:
                return
            for event in self.held:
                await transport.send_event(event)
            self.held, self.flushed = [], True
