"""Named sessions: the long-lived sessions that ``X-Metronome-Session`` keys name.

Each holds an open ``Conversation`` and a lock, so one request at a time replies on
it; a newer request interrupts the reply in flight (barge-in: the caller spoke
again). A session with no request for ``idle_timeout`` seconds is closed by the
reaper and its blocks go back to the pool. Entries exist only while their session is
admitted, so the admission cap bounds how many there are.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from .._log import get_logger
from ..integrations._conversation import Conversation

__all__ = ["Named", "SessionRegistry"]


@dataclass(eq=False)
class Named:
    key: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    conversation: Conversation | None = None  # None until its first request opened it
    system_prompt: str | None = None
    last_used: float = 0.0
    reply: anyio.CancelScope | None = None  # the reply in flight, cancelled by a newer request
    busy: bool = False


class SessionRegistry:
    """The open named sessions, by key."""

    def __init__(self, *, idle_timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_timeout = idle_timeout
        self._clock = clock
        self._entries: dict[str, Named] = {}
        self._log = get_logger()
        self.idle_closed = 0
        self._closing = 0  # dropped, their sessions not yet closed: they still hold blocks

    def __len__(self) -> int:
        return self._closing + sum(1 for e in self._entries.values() if e.conversation is not None)

    def entry(self, key: str) -> Named:
        """The entry for ``key``, made (empty) on first sight."""
        found = self._entries.get(key)
        if found is None:
            found = self._entries[key] = Named(key, last_used=self._clock())
        return found

    def find(self, key: str) -> Named | None:
        return self._entries.get(key)

    def touch(self, entry: Named) -> None:
        entry.last_used = self._clock()

    async def drop(self, entry: Named) -> None:
        """Forget ``entry`` and close its session (its blocks go back to the pool)."""
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
        conversation, entry.conversation = entry.conversation, None
        if conversation is not None:
            self._closing += 1
            try:
                await conversation.aclose()
            finally:
                self._closing -= 1

    async def reap(self) -> int:
        """Close the sessions idle past ``idle_timeout``; how many were closed."""
        now = self._clock()
        idle = [
            e
            for e in self._entries.values()
            if not e.busy and not e.lock.locked() and now - e.last_used >= self.idle_timeout
        ]
        for e in idle:
            await self.drop(e)
            self._log.info("serve.session_idle_closed", key=e.key, idle_timeout=self.idle_timeout)
        self.idle_closed += len(idle)
        return len(idle)

    async def aclose(self) -> None:
        """Interrupt every reply and close every session."""
        entries = list(self._entries.values())
        for e in entries:
            if e.reply is not None:
                e.reply.cancel()
        for e in entries:
            await self.drop(e)
