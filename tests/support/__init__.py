"""Helpers the tests share: a faulty engine backend (faults through the interface, not
monkeypatching) and a compiler that fails (through ``CXX``, as a user picks a compiler)."""

from .compiler import FailingCompiler
from .faulty import FaultyBackend, Hold

__all__ = ["FailingCompiler", "FaultyBackend", "Hold"]
