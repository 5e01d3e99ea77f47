"""Configuration: frozen, keyword-only, checked when made.

An error names the field and says how to fix it, so a bad value fails at start-up,
not in the middle of a call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from metronome_engine import KVPolicy

__all__ = ["AdmissionConfig", "EngineConfig", "TimingConfig"]

DEFAULT_MEMORY_BYTES = 256 << 20


def _positive_int(name: str, value: object, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}; {hint}")


def _positive_float(name: str, value: object, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}; {hint}")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """The embedded engine: which model, which KV policy, how big a block pool.

    ``kv="window"`` bounds every session to its first ``sinks`` tokens plus its last
    ``window`` tokens; ``kv="full"`` keeps everything (unbounded: the baseline that
    falls off the cliff). Size the pool with ``num_blocks`` or ``memory_bytes``; with
    neither, the pool takes 256 MiB.
    """

    model: str = "smollm2-135m-instruct"
    kv: Literal["window", "full"] = "window"
    window: int = 256
    sinks: int = 4
    num_blocks: int | None = None
    memory_bytes: int | None = None
    block_size: int = 16
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a model name or folder, got {self.model!r}; try 'smollm2-135m-instruct'")
        if self.kv not in ("window", "full"):
            raise ValueError(f"kv must be 'window' or 'full', got {self.kv!r}; 'window' bounds each session")
        _positive_int("window", self.window, "try window=256")
        if isinstance(self.sinks, bool) or not isinstance(self.sinks, int) or self.sinks < 0:
            raise ValueError(f"sinks must be an int >= 0, got {self.sinks!r}; 4 sinks is the usual choice")
        if self.num_blocks is not None and self.memory_bytes is not None:
            raise ValueError("give num_blocks or memory_bytes to size the block pool, not both")
        if self.num_blocks is not None:
            _positive_int("num_blocks", self.num_blocks, "give the pool at least one session's bound")
        if self.memory_bytes is not None:
            _positive_int("memory_bytes", self.memory_bytes, "try memory_bytes=256 << 20")
        _positive_int("block_size", self.block_size, "16 is a good default")
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"device must be a torch device name, got {self.device!r}; try 'cpu' or 'cuda'")

    def kv_policy(self) -> KVPolicy:
        if self.kv == "full":
            return KVPolicy.full()
        return KVPolicy.windowed(self.window, sinks=self.sinks)

    def pool_size(self) -> dict[str, int]:
        """The keyword that sizes the engine's pool: ``num_blocks`` or ``memory_bytes``."""
        if self.num_blocks is not None:
            return {"num_blocks": self.num_blocks}
        return {"memory_bytes": self.memory_bytes if self.memory_bytes is not None else DEFAULT_MEMORY_BYTES}


@dataclass(frozen=True, slots=True, kw_only=True)
class TimingConfig:
    """The metronome: one tick every ``period`` seconds; a frame is late after ``deadline``.

    ``deadline`` defaults to the period (a frame must be answered before the next one
    is due). ``strict`` raises ``DeadlineMissed`` for a late frame instead of
    delivering it flagged. ``max_chunk_tokens`` caps the tokens one session appends
    in one tick: longer input (a system prompt, a long text turn) is split across
    ticks, and the memory guard sizes each session's bound with it.
    """

    period: float = 0.080
    deadline: float | None = None
    strict: bool = False
    max_chunk_tokens: int = 64

    def __post_init__(self) -> None:
        _positive_float("period", self.period, "80 ms (period=0.08) is Moshi's 12.5 Hz frame rate")
        if self.deadline is not None:
            _positive_float("deadline", self.deadline, "leave it None to use the period")
        _positive_int("max_chunk_tokens", self.max_chunk_tokens, "try 64")

    @property
    def frame_deadline(self) -> float:
        return self.period if self.deadline is None else self.deadline


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionConfig:
    """AIMD on per-frame latency, the way TCP finds a link's capacity.

    Every ``interval`` seconds, once ``min_samples`` frames were measured, the
    ``percentile`` of their latency is compared with ``target`` x deadline:

    - under it, and the cap was in demand: the cap grows by ``increase`` (additive);
    - above it: the cap shrinks to ``decrease`` x cap (multiplicative), at least by one.

    Defaults and why: p95 rather than p99 because a decision sees a few dozen frames,
    too few for a stable p99; a target of 0.8 leaves a fifth of the deadline as
    headroom for jitter; a cut to 0.9 (not TCP's halving) because with a bounded KV
    latency rises smoothly with load, so a small step back is enough and a halving
    would idle half the machine; one second between decisions lets a new session's
    frames show up in the latency before the next decision. The cap starts at
    ``initial_limit`` and stays within ``[min_limit, max_limit]`` and under the memory
    guard. A blocking open waits up to ``queue_timeout`` seconds for room.
    """

    initial_limit: int = 4
    min_limit: int = 1
    max_limit: int = 1024
    increase: int = 1
    decrease: float = 0.9
    target: float = 0.8
    percentile: float = 0.95
    interval: float = 1.0
    min_samples: int = 16
    queue_timeout: float = 1.0

    def __post_init__(self) -> None:
        _positive_int("min_limit", self.min_limit, "a cap below one session admits nobody")
        _positive_int("max_limit", self.max_limit, "try max_limit=1024")
        _positive_int("initial_limit", self.initial_limit, "try initial_limit=4")
        if not self.min_limit <= self.initial_limit <= self.max_limit:
            raise ValueError(
                f"initial_limit={self.initial_limit} must lie in [min_limit={self.min_limit}, "
                f"max_limit={self.max_limit}]; move initial_limit inside the range"
            )
        _positive_int("increase", self.increase, "add one session per decision (increase=1)")
        if isinstance(self.decrease, bool) or not isinstance(self.decrease, int | float) or not 0 < self.decrease < 1:
            raise ValueError(f"decrease must be in (0, 1), got {self.decrease!r}; try 0.9 (TCP uses 0.5)")
        if isinstance(self.target, bool) or not isinstance(self.target, int | float) or not 0 < self.target <= 1:
            raise ValueError(f"target must be in (0, 1] (a fraction of the deadline), got {self.target!r}; try 0.8")
        if (
            isinstance(self.percentile, bool)
            or not isinstance(self.percentile, int | float)
            or not 0 < self.percentile <= 1
        ):
            raise ValueError(f"percentile must be in (0, 1], got {self.percentile!r}; try 0.95")
        _positive_float("interval", self.interval, "try interval=1.0 (seconds between decisions)")
        _positive_int("min_samples", self.min_samples, "try min_samples=16")
        if (
            isinstance(self.queue_timeout, bool)
            or not isinstance(self.queue_timeout, int | float)
            or not math.isfinite(self.queue_timeout)
            or self.queue_timeout < 0
        ):
            raise ValueError(f"queue_timeout must be a finite number >= 0, got {self.queue_timeout!r}; try 1.0")
