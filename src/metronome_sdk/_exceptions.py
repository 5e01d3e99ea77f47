"""Every error the SDK raises on purpose, in one tree.

::

    MetronomeError
    ├── Overloaded                 retryable back-pressure: .retry_after, .limit, .in_flight
    │   ├── AdmissionRejected      refused at the door, before any KV was allocated
    │   └── LoadShed               an admitted session dropped to protect the others
    ├── DeadlineMissed             also a TimeoutError: a frame missed its deadline (strict mode)
    ├── EngineError
    │   ├── EngineStalled          no step progress: pool exhausted, a failed or stuck step
    │   └── CacheExhausted         the pool cannot hold a session's bound: a sizing error
    └── SessionError
        ├── SessionClosed          used after the application closed it
        └── SessionBroken          the peer or transport died, or the session's state is corrupt

Catch a category (``Overloaded``, ``EngineError``, ``SessionError``) to handle a kind of
failure; the context of each error (session, limits, frame) is attached as attributes.
Bad arguments are ``ValueError``, as in the standard library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._frames import InputFrame, OutputFrame

__all__ = [
    "AdmissionRejected",
    "CacheExhausted",
    "DeadlineMissed",
    "EngineError",
    "EngineStalled",
    "LoadShed",
    "MetronomeError",
    "Overloaded",
    "SessionBroken",
    "SessionClosed",
    "SessionError",
]


class MetronomeError(Exception):
    """Base of every error the SDK raises on purpose."""


class Overloaded(MetronomeError):
    """Back-pressure: the engine has no room now. Retry after ``retry_after`` seconds.

    ``limit`` is the session cap at the time (AIMD cap or memory guard, whichever is lower)
    and ``in_flight`` the sessions it was serving. ``session_id`` is the session refused
    or shed, when one is known.
    """

    def __init__(
        self, message: str, *, retry_after: float, limit: int, in_flight: int, session_id: int | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.limit = limit
        self.in_flight = in_flight
        self.session_id = session_id


class AdmissionRejected(Overloaded):
    """A session was refused at the door, before any KV was allocated for it."""


class LoadShed(Overloaded):
    """An admitted session was dropped to protect the others.

    Raised when a session left ``ReliabilityConfig.output_queue`` outputs unread (a slow
    consumer, under ``slow_consumer="shed"``): its unread outputs come first, then this
    error; the session is closed and its blocks are back in the pool.
    """


class DeadlineMissed(MetronomeError, TimeoutError):
    """A frame's output came later than its deadline (raised only in strict timing mode).

    ``output`` is the late frame itself: its data is not lost.
    """

    def __init__(
        self, message: str, *, session_id: int | None, latency: float, deadline: float, output: OutputFrame | None
    ) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.latency = latency
        self.deadline = deadline
        self.output = output


class EngineError(MetronomeError):
    """The engine could not serve a frame."""

    def __init__(self, message: str, *, session_id: int | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id


class EngineStalled(EngineError):
    """A frame got no step progress. ``reason`` says why:

    - ``"pool_exhausted"``: the block pool was full; nothing of ``frame`` was appended,
      so it may be sent again once other sessions close.
    - ``"step_failed"``: the step raised on every try (the cause is chained); nothing
      was appended; the session stays open.
    - ``"step_stuck"``: the step ran past the watchdog's limit; the frame is handed
      back at once. If the stuck step completes later, its tokens are in the session's
      context (do not resend it) but its output is discarded.
    - ``"engine_failed"``: the engine shut down after repeated failures; the session is
      closed (later use raises this again). Make a new engine.
    """

    def __init__(
        self, message: str, *, session_id: int | None = None, reason: str, frame: InputFrame | None = None
    ) -> None:
        super().__init__(message, session_id=session_id)
        self.reason = reason
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


class SessionError(MetronomeError):
    """A session can no longer be used."""

    def __init__(self, message: str, *, session_id: int | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id


class SessionClosed(SessionError):
    """The session (or its engine) was closed by the application, then used."""


class SessionBroken(SessionError):
    """The session cannot go on: something outside the application died (the peer, the
    transport; see ``__cause__``), or its own state is corrupt (``reason="numeric_fault"``:
    its logits came out NaN or inf, so the engine dropped its cache and freed its blocks).
    """

    def __init__(self, message: str, *, session_id: int | None = None, reason: str | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.reason = reason
