"""Where the engine keeps what it makes once per machine: converted weights, kernel builds, their timings.

A leaf: it imports nothing of the engine, so every module can ask it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """``$METRONOME_CACHE``, or ``~/.cache/metronome``."""
    root = os.environ.get("METRONOME_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "metronome")
    return Path(root)
