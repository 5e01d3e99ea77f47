"""How each SDK exception reaches a client: HTTP status, OpenAI error type, Pipecat category.

One table, read by ``metronome serve``, the Pipecat service, the LiveKit plugin and the
docs (docs/integrations.md), so the three never disagree. The first row whose class
``exc`` is an instance of wins, so subclasses come before their bases.

``retryable`` is whether the same request may succeed if sent again: a full cap or a
stall before any output clears with time; a session that can never fit the pool
(``CacheExhausted``) or an engine that shut down does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._exceptions import (
    AdmissionRejected,
    CacheExhausted,
    DeadlineMissed,
    EngineStalled,
    LoadShed,
    MetronomeError,
    Overloaded,
    SessionBroken,
    SessionClosed,
)

__all__ = ["ErrorMapping", "error_mapping", "retry_after_seconds"]


@dataclass(frozen=True, slots=True)
class ErrorMapping:
    """One row of the table: what ``exception`` becomes at each boundary."""

    exception: str  # the SDK class name, sent as the OpenAI body's ``code``
    status: int  # HTTP status before the first token (after it: an error event in the stream)
    openai_type: str  # the OpenAI error body's ``type``
    pipecat: str  # the ``pipecat.utils.errors.ErrorCategory`` member's name
    retryable: bool  # sent as ``x-should-retry``


_TABLE: tuple[tuple[type[BaseException], ErrorMapping], ...] = (
    (AdmissionRejected, ErrorMapping("AdmissionRejected", 429, "rate_limit_error", "RATE_LIMIT", True)),
    (LoadShed, ErrorMapping("LoadShed", 429, "rate_limit_error", "RATE_LIMIT", True)),
    (Overloaded, ErrorMapping("Overloaded", 429, "rate_limit_error", "RATE_LIMIT", True)),
    (CacheExhausted, ErrorMapping("CacheExhausted", 400, "invalid_request_error", "INVALID_REQUEST", False)),
    (EngineStalled, ErrorMapping("EngineStalled", 503, "server_error", "SERVER", True)),
    (DeadlineMissed, ErrorMapping("DeadlineMissed", 504, "server_error", "SERVER", True)),
    (SessionBroken, ErrorMapping("SessionBroken", 500, "server_error", "SERVER", True)),
    (SessionClosed, ErrorMapping("SessionClosed", 503, "server_error", "SERVER", True)),
    (MetronomeError, ErrorMapping("MetronomeError", 500, "server_error", "SERVER", True)),
    (ValueError, ErrorMapping("ValueError", 400, "invalid_request_error", "INVALID_REQUEST", False)),
)

_ENGINE_FAILED = ErrorMapping("EngineStalled", 503, "server_error", "SERVER", False)
_UNKNOWN = ErrorMapping("InternalError", 500, "server_error", "UNKNOWN", True)


def error_mapping(exc: BaseException) -> ErrorMapping:
    """The row for ``exc``; an engine that shut itself down is not worth retrying."""
    if isinstance(exc, EngineStalled) and exc.reason == "engine_failed":
        return _ENGINE_FAILED
    for cls, row in _TABLE:
        if isinstance(exc, cls):
            return row
    return _UNKNOWN


def retry_after_seconds(exc: BaseException, default: float) -> float:
    """How long a client should wait before sending again: ``Overloaded.retry_after``, else ``default``."""
    if isinstance(exc, Overloaded) and math.isfinite(exc.retry_after) and exc.retry_after > 0:
        return float(exc.retry_after)
    return default


def rows() -> tuple[tuple[type[BaseException], ErrorMapping], ...]:
    """Every row, in order (the docs' table is checked against it)."""
    return _TABLE
