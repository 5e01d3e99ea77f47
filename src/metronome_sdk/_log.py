"""Logging: structlog over the stdlib logger ``metronome_sdk``.

The library never configures logging: it adds a ``NullHandler`` (so nothing prints
unless the application sets up logging) and emits events with names, not sentences
(``admission.rejected``, ``session.stalled``, ``session.closed``), bound with
``session_id`` where a session is involved.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import structlog
from structlog.typing import FilteringBoundLogger

__all__ = ["get_logger"]

_stdlib = logging.getLogger("metronome_sdk")
_stdlib.addHandler(logging.NullHandler())


def get_logger(**context: Any) -> FilteringBoundLogger:
    """A logger with ``context`` bound to every event (for example ``session_id``)."""
    log = cast(FilteringBoundLogger, structlog.wrap_logger(_stdlib))
    return log.bind(**context) if context else log
