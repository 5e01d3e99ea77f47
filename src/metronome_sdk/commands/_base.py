"""What a command is: the SDK's own commands and those another distribution brings."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Command"]


@dataclass(frozen=True, slots=True)
class Command:
    """One ``metronome`` command: ``metronome [group] name``, its arguments, and what it runs.

    ``run`` returns the exit status; it raises ``ValueError`` for bad input and ``MissingExtra``
    for an optional package that is not installed (one line on stderr, exit 2).
    """

    group: str | None  # "eval", "bench", or None for a top-level command
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
