"""One synthesis at a time, a reply's first words first: the gate in front of a voice that callers share.

A server's callers share one voice process. A caller whose turn just ended waits for its
reply's first part, while another caller's later sentences only have to be ready before the
audio queued ahead of them has played (a second or more). So a first part waiting at the gate
goes in before any later part waiting there; the synthesis under way is never cut.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__: list[str] = []  # internal: SpeechGate, for PiperTTS


class SpeechGate:
    """A lock that hands itself to a waiting ``first`` holder before any other waiter."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._busy = False
        self._first_waiting = 0

    @contextlib.contextmanager
    def hold(self, *, first: bool) -> Iterator[None]:
        with self._changed:
            self._first_waiting += first
            try:
                while self._busy or (not first and self._first_waiting):
                    self._changed.wait()
            finally:
                self._first_waiting -= first
            self._busy = True
        try:
            yield
        finally:
            with self._changed:
                self._busy = False
                self._changed.notify_all()

    @property
    def first_waiting(self) -> int:
        """First parts waiting at the gate now."""
        with self._changed:
            return self._first_waiting
