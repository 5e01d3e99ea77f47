"""``bench sweep``: per-frame latency against the number of sessions N, for both KV policies.

Every point is a fresh engine over the same block pool with N sessions streaming from the
first tick to the last; the two policies run back to back at each N. The pool holds every
session at the window's bound for the largest N, so the window never stalls; under
``kv=full`` sessions outgrow that bound within the point, and from some N on the pool fills
before the point ends.

A frame the engine never answered (stalled, dropped because its session was still waiting
for the previous one, or still queued at the end) counts with the time it had waited when
the point ended: a lower bound on its latency, so a p99 past the wall is a floor.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from metronome_engine import EngineCore
from metronome_engine.engine import Kernels
from metronome_engine.model import LlamaModel
from metronome_sdk import AdmissionConfig, Engine, TimingConfig
from metronome_sdk.estimators import percentile

from .workload import (
    Policy,
    SessionPlan,
    StreamExperiment,
    StreamSpec,
    WorkloadTrace,
    bench_model,
    run_workload,
)

__all__ = [
    "SweepConfig",
    "SweepPoint",
    "find_knee",
    "knee_near",
    "n_sched",
    "run_sweep",
    "search_n_sched",
    "sweep_point_from_trace",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepConfig(StreamExperiment):
    ns: tuple[int, ...] = (1, 2, 4, 6, 8, 10, 12, 14, 16)
    period: float = 0.5
    deadline: float | None = None  # the period
    tokens_per_frame: int = 8
    window: int = 32
    sinks: int = 4
    block_size: int = 16
    ticks: int = 20  # measured per point, before time_scale
    warmup_ticks: int = 4
    model: str = "smollm2-135m-instruct"
    policies: tuple[Policy, ...] = ("window", "full")
    time_scale: float = 1.0
    kernels: Kernels = "auto"

    def __post_init__(self) -> None:
        if not self.ns or any(n < 1 for n in self.ns):
            raise ValueError(f"ns must be session counts >= 1, got {self.ns}")
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")

    @property
    def spec(self) -> StreamSpec:
        return StreamSpec(period=self.period, tokens_per_frame=self.tokens_per_frame, lead=0.05 * self.period)

    @property
    def frame_deadline(self) -> float:
        return self.period if self.deadline is None else self.deadline

    @property
    def measured_ticks(self) -> int:
        return max(3, round(self.ticks * self.time_scale))

    @property
    def pool_blocks(self) -> int:
        return max(self.ns) * self.session_bound


@dataclass(slots=True)
class SweepPoint:
    policy: Policy
    n: int
    p50_ms: float
    p99_ms: float
    frames: int
    answered: int
    stalled: int
    errors: int  # frames answered with an engine error other than a stall
    dropped: int
    step_ms: float  # median engine step
    stalled_at_s: float | None  # seconds into the point when the pool first stalled
    peak_occupancy: float
    # the tick's token budget over the measured ticks, and the ticks where a session's input waited on it:
    # a point whose talking sessions fill the budget loses a frame at each of its dips
    budget_min: int | None = None
    budget_max: int | None = None
    budget_waits: int = 0
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    error_messages: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "frames": self.frames,
            "answered": self.answered,
            "stalled": self.stalled,
            "errors": self.errors,
            "dropped": self.dropped,
            "step_ms": self.step_ms,
            "stalled_at_s": self.stalled_at_s,
            "peak_occupancy": round(self.peak_occupancy, 4),
            "budget_min": self.budget_min,
            "budget_max": self.budget_max,
            "budget_waits": self.budget_waits,
            "error_messages": self.error_messages,
        }


def n_sched(points: Sequence[Any], deadline_ms: float) -> int:
    """The largest N whose p99 meets the deadline (0 when none does).

    ``points`` carry ``n`` and ``p99_ms`` (objects or dicts).
    """
    meeting = [_get(p, "n") for p in points if _get(p, "p99_ms") <= deadline_ms]
    return max(meeting, default=0)


def _get(p: Any, key: str) -> Any:
    return p[key] if isinstance(p, dict) else getattr(p, key)


def sweep_point_from_trace(kind: Policy, n: int, trace: WorkloadTrace, *, measure_from: float) -> SweepPoint:
    frames = [f for f in trace.frames if f.sent >= measure_from]
    waited = [trace.waited(f) * 1e3 for f in frames]
    stall = trace.first_stall()
    steps = [t.step_seconds * 1e3 for t in trace.ticks]
    measured = [t for t in trace.ticks if t.time >= measure_from]
    budgets = [t.tick_tokens for t in measured if t.tick_tokens is not None]
    return SweepPoint(
        policy=kind,
        n=n,
        p50_ms=round(percentile(waited, 0.5), 2) if waited else 0.0,
        p99_ms=round(percentile(waited, 0.99), 2) if waited else 0.0,
        frames=len(frames),
        answered=sum(1 for f in frames if f.outcome == "ok"),
        stalled=sum(1 for f in frames if f.outcome == "stalled"),
        errors=sum(1 for f in frames if f.outcome == "error"),
        dropped=sum(1 for f in frames if f.outcome == "dropped"),
        step_ms=round(statistics.median(steps), 2) if steps else 0.0,
        stalled_at_s=None if stall is None else round(stall.time - trace.start, 3),
        peak_occupancy=max((t.used_blocks / t.pool_blocks for t in trace.ticks), default=0.0),
        budget_min=min(budgets, default=None),
        budget_max=max(budgets, default=None),
        budget_waits=sum(1 for t in measured if t.waiting),
        latencies_ms=waited,
        error_messages=trace.errors[:3],
    )


async def _point(
    config: SweepConfig, model: LlamaModel, kind: Policy, n: int, on_round: Callable[[], None]
) -> SweepPoint:
    spec = config.spec
    core = EngineCore(
        model,
        policy=config.policy(kind),
        num_blocks=config.pool_blocks,
        block_size=config.block_size,
        kernels=config.kernels,
    )
    trace = WorkloadTrace(start=time.monotonic())
    engine = Engine(
        core=core,
        timing=TimingConfig(period=spec.period, deadline=config.frame_deadline, max_chunk_tokens=spec.tokens_per_tick),
        admission=AdmissionConfig(initial_limit=n, min_limit=n, max_limit=n, queue_timeout=0.0),  # no AIMD here
        on_tick=trace.ticks.append,
    )
    ticks = config.warmup_ticks + config.measured_ticks
    plans = [SessionPlan(i, 0.0, ticks * spec.period) for i in range(n)]
    async with engine:
        trace.start = time.monotonic()
        await run_workload(engine, plans, spec, trace, horizon=(ticks + 1) * spec.period, on_round=lambda _: on_round())
    # the first tick starts one session alone (see workload): measure from the warm-up's end
    return sweep_point_from_trace(kind, n, trace, measure_from=trace.start + config.warmup_ticks * spec.period)


def run_sweep(
    config: SweepConfig,
    *,
    model: LlamaModel | None = None,
    on_round: Callable[[], None] | None = None,
    on_point: Callable[[SweepPoint], None] | None = None,
) -> list[SweepPoint]:
    net = model if model is not None else bench_model(config.model)
    points: list[SweepPoint] = []

    async def main() -> None:
        # both policies at one N back to back: a shared machine's load drifts over minutes
        for n in config.ns:
            for kind in config.policies:
                point = await _point(config, net, kind, n, on_round or (lambda: None))
                points.append(point)
                if on_point is not None:
                    on_point(point)

    anyio.run(main)
    return points


async def find_knee(meets: Callable[[int], Awaitable[bool]], *, limit: int, readings: int = 2) -> int:
    """The largest N for which ``meets(N)`` holds, found by doubling from 1 and then bisecting.

    Asks about O(log N) counts; stops at ``limit`` when every count up to it meets (0 when 1
    does not). Assumes that meeting the deadline is monotone in N, as latency is. A count that
    misses is read again, up to ``readings`` times, and is a miss only if every reading missed:
    one stalled reading (a 7.5 s p99 at 16 sessions between 15 and 17 that met it) would
    otherwise end the search below the knee, while a count past the knee misses every time.
    """
    holds = _holds(meets, readings)
    good, bad = 0, None
    n = 1
    while n <= limit:
        if not await holds(n):
            bad = n
            break
        good, n = n, 2 * n
    if bad is None:
        return good
    while bad - good > 1:
        mid = (good + bad) // 2
        if await holds(mid):
            good = mid
        else:
            bad = mid
    return good


def _holds(meets: Callable[[int], Awaitable[bool]], readings: int) -> Callable[[int], Awaitable[bool]]:
    """A count holds when one of ``readings`` readings meets the deadline: one stalled reading is not the knee."""
    if readings < 1:
        raise ValueError(f"readings must be >= 1, got {readings}")

    async def holds(n: int) -> bool:
        for _ in range(readings):
            if await meets(n):
                return True
        return False

    return holds


async def walk_knee(meets: Callable[[int], Awaitable[bool]], *, start: int, reach: int, readings: int = 2) -> int:
    """The knee found by stepping one count at a time from ``start``: up while a count holds, down while it misses.

    The same criterion as ``find_knee`` (a count holds when one of ``readings`` readings meets it),
    for a knee known to be near ``start``: a count or two of readings instead of a whole search.
    Goes up at most ``reach`` counts (``start + reach`` is then a floor); down as far as it must,
    0 when 1 misses.
    """
    if start < 1 or reach < 1:
        raise ValueError(f"start and reach must be >= 1, got {start} and {reach}")
    holds = _holds(meets, readings)
    if await holds(start):
        n = start
        while n < start + reach and await holds(n + 1):
            n += 1
        return n
    n = start - 1
    while n >= 1 and not await holds(n):
        n -= 1
    return n


async def knee_near(
    config: SweepConfig,
    model: LlamaModel,
    *,
    start: int,
    reach: int = 4,
    on_round: Callable[[], None] | None = None,
) -> tuple[int, list[SweepPoint]]:
    """The knee under ``kv=window`` measured now, near ``start``, and the readings that found it.

    The machine's speed drifts over the minutes a benchmark runs (a shared host's neighbours);
    a knee read beside a run is the reference that run met, where the search's is one from
    minutes before. Each reading is a sweep point, judged as ``search_n_sched`` judges one.
    """
    points: list[SweepPoint] = []
    knee = await walk_knee(_window_reading(config, model, points, on_round=on_round), start=start, reach=reach)
    return knee, points


def _window_reading(
    config: SweepConfig,
    model: LlamaModel,
    points: list[SweepPoint],
    *,
    on_round: Callable[[], None] | None = None,
    on_point: Callable[[SweepPoint], None] | None = None,
) -> Callable[[int], Awaitable[bool]]:
    """``meets(n)`` for the knee's searches: one window point of ``n`` sessions, kept in ``points``."""
    deadline_ms = config.frame_deadline * 1e3

    async def meets(n: int) -> bool:
        # each point's pool holds its own N at the window's bound (the sweep's pool is sized for max(ns))
        point = await _point(replace(config, ns=(n,)), model, "window", n, on_round or (lambda: None))
        points.append(point)
        if on_point is not None:
            on_point(point)
        return point.p99_ms <= deadline_ms  # the criterion of n_sched()

    return meets


def search_n_sched(
    config: SweepConfig,
    *,
    model: LlamaModel | None = None,
    limit: int = 64,
    on_round: Callable[[], None] | None = None,
    on_point: Callable[[SweepPoint], None] | None = None,
) -> list[SweepPoint]:
    """Find the knee under ``kv=window``: N doubles from 1 until a point misses the deadline, then bisects.

    A point that misses is measured again (``find_knee``'s ``readings``); every reading is among
    the points returned, and ``n_sched`` of them is the largest N one of whose readings met it.
    A fixed list of N says nothing past its largest entry (a machine that holds more looks like it
    holds exactly that many); the search ends with a point that meets the deadline next to one that
    does not (or at ``limit``), so ``n_sched`` of its points is the knee itself.
    """
    net = model if model is not None else bench_model(config.model)
    points: list[SweepPoint] = []
    measure = _window_reading(config, net, points, on_round=on_round, on_point=on_point)

    async def main() -> None:
        await find_knee(measure, limit=limit)

    anyio.run(main)
    return points


def summarize(config: SweepConfig, points: list[SweepPoint]) -> dict[str, Any]:
    deadline_ms = config.frame_deadline * 1e3
    out: dict[str, Any] = {}
    for kind in config.policies:
        out[kind] = [p.as_dict() for p in points if p.policy == kind]
    out["deadline_ms"] = deadline_ms
    window = [p for p in points if p.policy == "window"]
    full = [p for p in points if p.policy == "full"]
    out["n_sched"] = n_sched(window, deadline_ms) if window else None
    out["n_sched_full"] = n_sched(full, deadline_ms) if full else None
    spec = config.spec
    out["config"] = {
        "ns": list(config.ns),
        "period_s": spec.period,
        "tokens_per_tick": spec.tokens_per_tick,
        "window": config.window,
        "sinks": config.sinks,
        "block_size": config.block_size,
        "pool_blocks": config.pool_blocks,
        "session_bound_blocks": config.session_bound,
        "measured_ticks": config.measured_ticks,
        "warmup_ticks": config.warmup_ticks,
        "model": config.model,
        "kernels": config.kernels,
        "time_scale": config.time_scale,
    }
    return out
