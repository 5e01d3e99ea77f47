"""``bench cliff``: the same seeded workload under ``kv=full`` and ``kv=window``, run after run.

The pool holds exactly what the window policy needs for every session at its bound, so the
window can never stall; the full policy keeps every token, and whether a run falls off the
cliff depends on a race between the pool filling and sessions leaving (metastable).

The engine's own gauge says when: ``TickReport.t_sat`` (``engine.stats().t_sat`` after each
tick, free blocks ``/ (N * r)`` with ``r`` measured) is recorded at every tick from the start
of each run and scored after it against the first stall (``forecast.score``: its error at
fixed lead times before the stall, and when the alarm ``t_sat < alarm`` fired). Nothing is
chosen knowing when the stall came. The runs are short (the pool fills in about 2 s), so only
the short leads have scores; ``bench forecast`` runs the long ones, on traffic that varies.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from metronome_engine import EngineCore
from metronome_engine.model import LlamaModel
from metronome_sdk import AdmissionConfig, Engine, TimingConfig
from metronome_sdk.estimators import percentile

from .concurrent import run_concurrently
from .forecast import (
    ALARM_S,
    GAUGE_COLUMNS,
    LEADS,
    ForecastScore,
    GaugePoint,
    gauge_rows,
    gauge_series,
    score,
    summarize_scores,
)
from .silent import SilentBackend
from .workload import (
    Policy,
    StreamExperiment,
    StreamSpec,
    WorkloadTrace,
    bench_model,
    plan_sessions,
    run_workload,
)

__all__ = [
    "CliffConfig",
    "CliffRun",
    "run_cliff",
    "summarize",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class CliffConfig(StreamExperiment):
    sessions: int = 8
    runs: int = 20
    period: float = 0.08  # Moshi's 12.5 Hz
    tokens_per_frame: int = 8  # FixedRateCodec's default
    window: int = 256
    sinks: int = 4
    block_size: int = 16
    arrival_spread: float = 0.8  # seconds, before time_scale
    duration: tuple[float, float] = (2.2, 7.0)  # seconds, before time_scale
    seed: int = 0
    model: str = "small"
    silent: bool = False
    concurrency: int = 5
    time_scale: float = 1.0
    alarm: float = ALARM_S  # seconds: the alarm t_sat < alarm

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.runs < 1:
            raise ValueError(f"sessions and runs must be >= 1, got {self.sessions} and {self.runs}")
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")

    @property
    def spec(self) -> StreamSpec:
        p = self.period * self.time_scale
        # a run measures the pool: frames queue rather than drop, so every tick appends; the lead is
        # wide because five engines share one event loop, and a frame that misses its tick stays behind
        return StreamSpec(period=p, tokens_per_frame=self.tokens_per_frame, lead=0.25 * p, drop_late=False)

    @property
    def pool_blocks(self) -> int:
        """Exactly the window's need: every session at its bound."""
        return self.sessions * self.session_bound

    @property
    def blocks_per_second(self) -> float:
        """Blocks per second one streaming session adds under the full policy."""
        return self.spec.tokens_per_tick / (self.block_size * self.spec.period)


@dataclass(slots=True)
class CliffRun:
    policy: Policy
    run: int
    collapsed: bool
    stalls: int
    frames: dict[str, int]
    peak_occupancy: float
    gauge: list[GaugePoint]  # the engine's t_sat after every tick
    forecast: ForecastScore
    dashboard_p50_ms: float | None  # what a latency dashboard shows: every answered frame, empty ones too
    dashboard_p99_ms: float | None
    deadline_misses: int
    tick_interval_ms: float  # mean time between ticks (the period when the engine keeps time)
    stalled_at: float | None = None  # seconds into the run of the first stall
    occupancy: list[tuple[float, float]] = field(default_factory=list)  # (seconds, occupancy)
    empty_share: list[tuple[float, float]] = field(default_factory=list)  # (seconds, share of frames empty)

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "run": self.run,
            "collapsed": self.collapsed,
            "stalls": self.stalls,
            "frames": self.frames,
            "peak_occupancy": round(self.peak_occupancy, 4),
            "stalled_at_s": None if self.stalled_at is None else round(self.stalled_at, 4),
            "forecast": self.forecast.as_dict(),
            "gauge": {
                "columns": GAUGE_COLUMNS,
                "points": gauge_rows(self.gauge),
            },
            "dashboard_p50_ms": self.dashboard_p50_ms,
            "dashboard_p99_ms": self.dashboard_p99_ms,
            "deadline_misses": self.deadline_misses,
            "tick_interval_ms": round(self.tick_interval_ms, 2),
        }


async def _one_run(config: CliffConfig, model: LlamaModel, kind: Policy, run: int) -> CliffRun:
    spec = config.spec
    scale = config.time_scale
    lo, hi = config.duration
    plans = plan_sessions(
        config.sessions,
        seed=config.seed * 100_003 + run,  # the same sessions under both policies
        arrival_spread=config.arrival_spread * scale,
        duration=(lo * scale, hi * scale),
    )
    core = EngineCore(model, policy=config.policy(kind), num_blocks=config.pool_blocks, block_size=config.block_size)
    silent = SilentBackend(core) if config.silent else None  # the legacy behaviour: stalls answered with silence
    n = config.sessions
    trace = WorkloadTrace(start=time.monotonic())
    engine = Engine(
        core=silent or core,
        timing=TimingConfig(period=spec.period, max_chunk_tokens=spec.tokens_per_tick),
        # no latency-driven cap here: every planned session is let in (the memory guard still applies)
        admission=AdmissionConfig(initial_limit=n, min_limit=n, max_limit=n, queue_timeout=0.0),
        on_tick=trace.ticks.append if silent is None else lambda r: trace.ticks.append(silent.report(r)),
    )
    horizon = max(p.arrival + p.duration for p in plans) + 4 * spec.period
    async with engine:
        trace.start = time.monotonic()
        await run_workload(engine, plans, spec, trace, horizon=horizon)
    return _summarize_run(config, kind, run, trace)


def _summarize_run(config: CliffConfig, kind: Policy, run: int, trace: WorkloadTrace) -> CliffRun:
    ticks = [t for t in trace.ticks if t.time >= trace.start]
    gauge = gauge_series(ticks, trace.start)
    outcomes: dict[str, int] = {}
    for f in trace.frames:
        outcomes[f.outcome] = outcomes.get(f.outcome, 0) + 1
    dash = [f.latency for f in trace.frames if f.latency is not None]
    deadline = config.spec.period
    intervals = [b.time - a.time for a, b in itertools.pairwise(ticks) if b.time - a.time < 1.5 * deadline]
    bucket = config.spec.period * 5
    empty: dict[int, list[bool]] = {}
    for f in trace.frames:
        if f.outcome in ("ok", "empty", "stalled"):
            empty.setdefault(int((f.sent - trace.start) / bucket), []).append(f.outcome != "ok")
    stall = trace.first_stall()
    stalled_at = None if stall is None else stall.time - trace.start
    leads = tuple(lead * config.time_scale for lead in LEADS)
    return CliffRun(
        policy=kind,
        run=run,
        collapsed=trace.first_stall() is not None,
        stalls=trace.stalls(),
        frames=outcomes,
        peak_occupancy=max((t.used_blocks / t.pool_blocks for t in ticks), default=0.0),
        gauge=gauge,
        forecast=score(gauge, stalled_at, leads=leads, threshold=config.alarm * config.time_scale),
        dashboard_p50_ms=round(percentile(dash, 0.5) * 1e3, 2) if dash else None,
        dashboard_p99_ms=round(percentile(dash, 0.99) * 1e3, 2) if dash else None,
        deadline_misses=sum(1 for v in dash if v > deadline),
        tick_interval_ms=statistics.mean(intervals) * 1e3 if intervals else math.nan,
        stalled_at=stalled_at,
        occupancy=[(t.time - trace.start, t.used_blocks / t.pool_blocks) for t in ticks],
        empty_share=[((k + 0.5) * bucket, sum(v) / len(v)) for k, v in sorted(empty.items())],
    )


def run_cliff(config: CliffConfig, *, on_run: Callable[[CliffRun], None] | None = None) -> list[CliffRun]:
    """Every run under both policies, ``config.concurrency`` engines at a time."""
    model = bench_model(config.model)
    runs = [
        functools.partial(_one_run, config, model, kind, run)
        for run in range(config.runs)
        for kind in ("full", "window")
    ]
    results = run_concurrently(runs, concurrency=config.concurrency, on_run=on_run)
    return sorted(results, key=lambda r: (r.policy, r.run))


def summarize(config: CliffConfig, runs: list[CliffRun]) -> dict[str, Any]:
    """The JSON report: collapses per policy, the gauge's forecast scored against each collapse."""
    out: dict[str, Any] = {}
    for kind in ("full", "window"):
        mine = [r for r in runs if r.policy == kind]
        entry: dict[str, Any] = {
            "runs": len(mine),
            "collapsed": sum(r.collapsed for r in mine),
            "forecast": summarize_scores([r.forecast for r in mine]),
            "peak_occupancy_max": round(max((r.peak_occupancy for r in mine), default=0.0), 4),
            "stalls": sum(r.stalls for r in mine),
            "per_run": [r.as_dict() for r in mine],
        }
        if config.silent:
            frames = [f for r in mine for f in _expand(r.frames)]
            answered = sum(1 for f in frames if f in ("ok", "empty"))
            entry["silent"] = {
                "frames_answered": answered,
                "frames_empty": sum(1 for f in frames if f == "empty"),
                "deadline_misses": sum(r.deadline_misses for r in mine),
                "dashboard_p99_ms_max": max((r.dashboard_p99_ms or 0.0 for r in mine), default=0.0),
            }
        out[kind] = entry
    spec = config.spec
    out["config"] = {
        "sessions": config.sessions,
        "runs": config.runs,
        "period_s": spec.period,
        "tokens_per_tick": spec.tokens_per_tick,
        "block_size": config.block_size,
        "window": config.window,
        "sinks": config.sinks,
        "pool_blocks": config.pool_blocks,
        "session_bound_blocks": config.session_bound,
        "nominal_r_blocks_per_s": round(config.blocks_per_second, 4),
        "arrival_spread_s": config.arrival_spread * config.time_scale,
        "duration_s": [d * config.time_scale for d in config.duration],
        "model": config.model,
        "silent": config.silent,
        "seed": config.seed,
        "time_scale": config.time_scale,
        "alarm_s": config.alarm * config.time_scale,
        "gauge": "TickReport.t_sat: engine.stats().t_sat after every tick, free blocks / (N * r), r measured",
    }
    return out


def _expand(counts: dict[str, int]) -> list[str]:
    return [k for k, v in counts.items() for _ in range(v)]
