"""The SDK's own commands of the ``metronome`` CLI (``bench`` and ``eval`` come from metronome-bench)."""

from __future__ import annotations

from ._base import Command
from .demo import DEMO
from .serve import SERVE

__all__ = ["COMMANDS", "Command"]

COMMANDS: tuple[Command, ...] = (DEMO, SERVE)
