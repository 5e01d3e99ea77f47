"""Commands of the ``metronome`` CLI, one module each."""

from __future__ import annotations

from ._base import Command
from .bench_step import BENCH_STEP
from .demo import DEMO
from .eval_ppl import EVAL_PPL
from .eval_quality import EVAL_QUALITY

__all__ = ["COMMANDS", "Command"]

COMMANDS: tuple[Command, ...] = (DEMO, EVAL_PPL, EVAL_QUALITY, BENCH_STEP)
