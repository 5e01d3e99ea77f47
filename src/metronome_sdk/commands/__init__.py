"""Commands of the ``metronome`` CLI, one module each."""

from __future__ import annotations

from ._base import Command
from .bench_admit import BENCH_ADMIT
from .bench_cliff import BENCH_CLIFF
from .bench_forecast import BENCH_FORECAST
from .bench_step import BENCH_STEP
from .bench_sweep import BENCH_SWEEP
from .bench_voice import BENCH_VOICE
from .demo import DEMO
from .eval_answers import EVAL_ANSWERS
from .eval_memory import EVAL_MEMORY
from .eval_ppl import EVAL_PPL
from .eval_quality import EVAL_QUALITY
from .eval_turns import EVAL_TURNS
from .eval_voice import EVAL_VOICE
from .serve import SERVE

__all__ = ["COMMANDS", "Command"]

COMMANDS: tuple[Command, ...] = (
    DEMO,
    SERVE,
    EVAL_PPL,
    EVAL_QUALITY,
    EVAL_MEMORY,
    EVAL_VOICE,
    EVAL_ANSWERS,
    EVAL_TURNS,
    BENCH_STEP,
    BENCH_CLIFF,
    BENCH_FORECAST,
    BENCH_SWEEP,
    BENCH_ADMIT,
    BENCH_VOICE,
)
