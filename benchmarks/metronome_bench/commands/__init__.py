"""``metronome bench`` and ``metronome eval``: the entry point ``metronome.commands`` names ``COMMANDS``."""

from __future__ import annotations

from metronome_sdk.cli import Command

from .bench_admit import BENCH_ADMIT
from .bench_cliff import BENCH_CLIFF
from .bench_forecast import BENCH_FORECAST
from .bench_step import BENCH_STEP
from .bench_sweep import BENCH_SWEEP
from .bench_voice import BENCH_VOICE
from .eval_answers import EVAL_ANSWERS
from .eval_memory import EVAL_MEMORY
from .eval_ppl import EVAL_PPL
from .eval_quality import EVAL_QUALITY
from .eval_turns import EVAL_TURNS
from .eval_voice import EVAL_VOICE

__all__ = ["COMMANDS"]

COMMANDS: tuple[Command, ...] = (
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
