"""``Signal``: a wake-up that fires many times, for waiters that check a condition first.

anyio's ``Event`` fires once. Renewing one in the waiter (``if set: make a new one``) strands
any other task still waiting on the old one; this renews it in ``fire()`` instead, and makes
it lazily, so a signal can be made outside an event loop. A waiter checks its condition, then
waits, with no await in between: a fire cannot fall in the gap.
"""

from __future__ import annotations

import anyio

__all__: list[str] = []  # internal: Signal


class Signal:
    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event: anyio.Event | None = None

    def fire(self) -> None:
        """Wake every task waiting now."""
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def wait(self) -> None:
        """Wait for the next ``fire()``."""
        if self._event is None:
            self._event = anyio.Event()
        await self._event.wait()
