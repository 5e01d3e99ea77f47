"""Helpers the tests share: a faulty engine backend (faults through the interface, not monkeypatching)."""

from .faulty import FaultyBackend, Hold

__all__ = ["FaultyBackend", "Hold"]
