"""Every error the SDK raises on purpose, in one tree.

::

    MetronomeError
    ├── Overloaded                 retryable back-pressure: .retry_after
    │   ├── AdmissionRejected      refused at the door, before any KV was allocated (.limit, .in_flight)
    │   ├── LoadShed               an admitted session dropped to protect the others (.limit, .in_flight)
    │   └── InputQueueFull         send() found the session's input queue full; nothing was queued
    ├── DeadlineMissed             also a TimeoutError: a frame missed its deadline (strict mode)
    ├── TurnInterrupted            the frame's reply was stopped by interrupt(); nothing to deliver
    ├── RewindUnavailable          rewind() cannot go back to the mark; the context since it stays
    ├── EngineError
    │   ├── EngineStalled          no step progress: .reason, a StallReason
    │   ├── CacheExhausted         the pool cannot hold a session's bound: a sizing error
    │   └── EngineClosed           used after the application closed the engine
    └── SessionError
        ├── SessionClosed          used after the application closed it
        └── SessionBroken          the peer or transport died, or the session's state is corrupt

Catch a category (``Overloaded``, ``EngineError``, ``SessionError``) to handle a kind of
failure; the context of each error (limits, frame) is attached as attributes, and every
error carries ``session_id`` (``None`` where no session is involved). ``StallReason`` is
the enum of ``EngineStalled.reason``.
Bad arguments are ``ValueError``, as in the standard library.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._frames import InputFrame, OutputFrame

__all__ = [
    "AdmissionRejected",
    "CacheExhausted",
    "DeadlineMissed",
    "EngineClosed",
    "EngineError",
    "EngineStalled",
    "InputQueueFull",
    "LoadShed",
    "MetronomeError",
    "Overloaded",
    "RewindUnavailable",
    "SessionBroken",
    "SessionClosed",
    "SessionError",
    "StallReason",
    "TurnInterrupted",
]


class StallReason(enum.StrEnum):
    """Why a frame got no step progress (``EngineStalled.reason``); compares equal to its value."""

    POOL_EXHAUSTED = "pool_exhausted"  # the block pool was full: nothing appended, resend the frame later
    CONTEXT_LIMIT = "context_limit"  # the backend's longest stream (vLLM's max_model_len) is reached
    STEP_FAILED = "step_failed"  # the step raised on every try: nothing appended
    STEP_STUCK = "step_stuck"  # the step ran past the watchdog's limit
    ENGINE_FAILED = "engine_failed"  # the engine shut down after repeated failures


class MetronomeError(Exception):
    """Base of every error the SDK raises on purpose. ``session_id``: the session involved, if any."""

    def __init__(self, message: str, *, session_id: int | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id


class Overloaded(MetronomeError):
    """Back-pressure: the engine has no room now. Retry after ``retry_after`` seconds."""

    def __init__(self, message: str, *, retry_after: float, session_id: int | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.retry_after = retry_after


class AdmissionRejected(Overloaded):
    """A session was refused at the door, before any KV was allocated for it.

    ``limit`` is the session cap at the time (AIMD cap or memory guard, whichever is lower)
    and ``in_flight`` the sessions the engine was serving.
    """

    def __init__(
        self, message: str, *, retry_after: float, limit: int, in_flight: int, session_id: int | None = None
    ) -> None:
        super().__init__(message, retry_after=retry_after, session_id=session_id)
        self.limit = limit
        self.in_flight = in_flight


class LoadShed(Overloaded):
    """An admitted session was dropped to protect the others (``limit``, ``in_flight`` as for admission).

    Raised when a session left ``ReliabilityConfig.output_queue`` outputs unread (a slow
    consumer, under ``slow_consumer="shed"``), when a step ran past the watchdog's limit on a
    machine too slow for the load, or when the machine slowed with sessions in and their frames
    still miss the deadline with admission stopped (``AdmissionConfig(policy="model")``: the
    newest go first). Its unread outputs come first, then this error; the session is closed and
    its blocks are back in the pool.
    """

    def __init__(
        self, message: str, *, retry_after: float, limit: int, in_flight: int, session_id: int | None = None
    ) -> None:
        super().__init__(message, retry_after=retry_after, session_id=session_id)
        self.limit = limit
        self.in_flight = in_flight


class InputQueueFull(Overloaded):
    """``send_nowait()`` (or ``send()``) found ``ReliabilityConfig.input_queue`` frames waiting.

    Nothing was queued; the frames before keep their place. Send again after ``retry_after``
    (one tick), or use ``send()``, which waits for room.
    """


class DeadlineMissed(MetronomeError, TimeoutError):
    """A frame's output came later than its deadline (raised only in strict timing mode).

    ``output`` is the late frame itself: its data is not lost.
    """

    def __init__(
        self, message: str, *, session_id: int | None, latency: float, deadline: float, output: OutputFrame | None
    ) -> None:
        super().__init__(message, session_id=session_id)
        self.latency = latency
        self.deadline = deadline
        self.output = output


class TurnInterrupted(MetronomeError):
    """The frame's output was withdrawn by ``Session.interrupt()`` (barge-in) before it was delivered.

    ``index`` is the frame's number within its session. The session stays open.
    """

    def __init__(self, message: str, *, session_id: int | None = None, index: int) -> None:
        super().__init__(message, session_id=session_id)
        self.index = index


class RewindUnavailable(MetronomeError):
    """``Session.rewind(mark)`` cannot go back: the session went more than ``rewind_tokens``
    past the mark (its hold lapsed and the window moved on), or ``mark`` is not its current
    mark. Nothing changed: the context since the mark stays, and the session goes on."""

    def __init__(self, message: str, *, session_id: int | None = None, tokens_since: int) -> None:
        super().__init__(message, session_id=session_id)
        self.tokens_since = tokens_since


class EngineError(MetronomeError):
    """The engine could not serve a frame."""


class EngineStalled(EngineError):
    """A frame got no step progress. ``reason`` (a ``StallReason``) says why:

    - ``POOL_EXHAUSTED``: the block pool was full; nothing of ``frame`` was appended,
      so it may be sent again once other sessions close.
    - ``CONTEXT_LIMIT``: the session reached the longest stream its backend can hold;
      nothing was appended; open a new session (or bound it with ``kv="window"``).
    - ``STEP_FAILED``: the step raised on every try (the cause is chained); nothing
      was appended; the session stays open.
    - ``STEP_STUCK``: the step ran past the watchdog's limit; the frame is handed
      back at once. If the stuck step completes later, its tokens are in the session's
      context (do not resend it) but its output is discarded.
    - ``ENGINE_FAILED``: the engine shut down after repeated failures; the session is
      closed (later use raises this again). Make a new engine.
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: int | None = None,
        reason: StallReason,
        frame: InputFrame | None = None,
    ) -> None:
        super().__init__(message, session_id=session_id)
        self.reason = StallReason(reason)
        self.frame = frame


class CacheExhausted(EngineError):
    """The pool can never hold this session: ``needed_blocks`` exceed ``pool_blocks``.

    A sizing error, not load: give the engine more memory, or bound the session with a
    window policy.
    """

    def __init__(self, message: str, *, session_id: int | None = None, needed_blocks: int, pool_blocks: int) -> None:
        super().__init__(message, session_id=session_id)
        self.needed_blocks = needed_blocks
        self.pool_blocks = pool_blocks


class EngineClosed(EngineError):
    """The engine was closed by the application (``aclose()``, leaving ``async with``), then used."""


class SessionError(MetronomeError):
    """A session can no longer be used."""


class SessionClosed(SessionError):
    """The session was closed by the application, then used."""


class SessionBroken(SessionError):
    """The session cannot go on: something outside the application died (the peer, the
    transport; see ``__cause__``), or its own state is corrupt (``reason="numeric_fault"``:
    its logits came out NaN or inf, so the engine dropped its cache and freed its blocks).
    """

    def __init__(self, message: str, *, session_id: int | None = None, reason: str | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.reason = reason
