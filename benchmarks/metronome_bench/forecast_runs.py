"""``bench forecast``: the live ``t_sat`` gauge, recorded from the first tick, scored against the collapse.

Traffic is not nominal: each session's tokens per frame follow a seeded conversation
(``traffic.Talk``: silence, short turns, long answers), sessions arrive over the first
``arrival_spread`` seconds and leave after ``duration``, so ``N`` changes and the growth rate
must be measured. Three families of runs, the same sessions in each run of a seed:

- ``full``: the unbounded policy on a pool most runs fill (the forecast's lead-time errors,
  and whether the alarm fires before every collapse);
- ``calm``: the unbounded policy on a pool ``calm_pool_scale`` times larger, where sessions
  mostly leave before it fills (false alarms);
- ``window``: the bounded policy on the ``full`` pool (false alarms; it never stalls).

A run stops ``after_stall`` seconds after its first stall (what follows is the collapse,
not the forecast) or when every session has left. The engine's gauge is read from its tick
reports; each run's ticks are also replayed through the same estimator with other growth
windows, to show how the error depends on the window.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from metronome_engine import EngineCore
from metronome_engine.model import LlamaModel
from metronome_sdk import AdmissionConfig, Engine, TimingConfig

from .concurrent import run_concurrently
from .forecast import (
    ALARM_S,
    GAUGE_COLUMNS,
    LEADS,
    ForecastScore,
    GaugePoint,
    gauge_rows,
    gauge_series,
    replay,
    score,
    summarize_scores,
)
from .traffic import TalkMix, talks
from .workload import (
    Policy,
    StreamExperiment,
    StreamSpec,
    WorkloadTrace,
    bench_model,
    plan_sessions,
    run_workload,
)

__all__ = ["Family", "ForecastConfig", "ForecastRun", "WINDOWS", "run_forecast", "summarize_forecast"]

Family = Literal["full", "calm", "window"]
FAMILIES: tuple[Family, ...] = ("full", "calm", "window")
WINDOWS: tuple[float, ...] = (1.0, 2.5, 5.0, 10.0, 20.0)  # growth windows replayed, seconds
ALARMS: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 20.0)  # alarm thresholds scored, seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class ForecastConfig(StreamExperiment):
    sessions: int = 8
    runs: int = 20
    period: float = 0.08
    window: int = 256
    sinks: int = 4
    block_size: int = 16
    pool: int = 560  # blocks: most full runs fill it in 20-35 s
    calm_pool_scale: float = 1.4
    arrival_spread: float = 15.0  # seconds
    duration: tuple[float, float] = (15.0, 50.0)  # seconds
    after_stall: float = 1.0
    growth_window: float = 5.0  # the engine's (TimingConfig.growth_window)
    windows: tuple[float, ...] = WINDOWS
    leads: tuple[float, ...] = LEADS
    alarm: float = ALARM_S
    alarms: tuple[float, ...] = ALARMS  # thresholds also scored on the live gauge: lead against false alarms
    mix: TalkMix = field(default_factory=TalkMix)
    families: tuple[Family, ...] = FAMILIES
    seed: int = 0
    model: str = "small"
    concurrency: int = 5
    series_every: int = 1  # ticks between the gauge points kept in the report

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.runs < 1 or self.concurrency < 1 or self.series_every < 1:
            raise ValueError("sessions, runs, concurrency and series_every must be >= 1")
        if self.pool < self.sessions * self.session_bound:
            raise ValueError(f"pool={self.pool} blocks cannot hold {self.sessions} windowed sessions at their bound")
        if not self.calm_pool_scale >= 1:
            raise ValueError(f"calm_pool_scale must be >= 1, got {self.calm_pool_scale}")
        if not self.alarm > 0 or not self.growth_window > 0 or not self.windows:
            raise ValueError("alarm and growth_window must be > 0 seconds, and windows not empty")
        if any(f not in FAMILIES for f in self.families):
            raise ValueError(f"families must be among {FAMILIES}, got {self.families}")

    @property
    def spec(self) -> StreamSpec:
        # frames queue rather than drop: every frame's tokens reach the pool, as a real session's would
        return StreamSpec(
            period=self.period, tokens_per_frame=self.mix.speech_tokens, lead=0.25 * self.period, drop_late=False
        )

    @property
    def max_chunk(self) -> int:
        """Tokens one tick may append for a session: a speech frame and its fed-back token, or an answer's."""
        return max(self.mix.speech_tokens + 1, self.mix.answer_tokens[1] + 1)

    def pool_blocks(self, family: Family) -> int:
        return round(self.pool * self.calm_pool_scale) if family == "calm" else self.pool


@dataclass(slots=True)
class ForecastRun:
    family: Family
    run: int
    pool_blocks: int
    series: list[GaugePoint]  # the live gauge, every tick
    score: ForecastScore
    replays: dict[float, ForecastScore]  # growth window -> the replayed gauge's score
    replay_max_diff: float  # the replay at the engine's window against the live gauge (0: the same)
    peak_occupancy: float
    seconds: float
    tick_interval: float  # mean seconds between ticks: the period when the engine keeps time

    def as_dict(self, every: int = 1) -> dict[str, Any]:
        return {
            "family": self.family,
            "run": self.run,
            "pool_blocks": self.pool_blocks,
            "collapsed": self.score.collapsed,
            "peak_occupancy": round(self.peak_occupancy, 4),
            "tick_interval_ms": round(self.tick_interval * 1e3, 2),
            "forecast": self.score.as_dict(),
            "replay_max_diff_s": round(self.replay_max_diff, 9),
            "gauge": {
                "every_ticks": every,
                "columns": GAUGE_COLUMNS,
                "points": gauge_rows(self.series[::every]),
            },
        }


async def _one_run(config: ForecastConfig, model: LlamaModel, family: Family, run: int) -> ForecastRun:
    spec = config.spec
    seed = config.seed * 100_003 + run  # the same sessions and conversations in every family
    plans = plan_sessions(config.sessions, seed=seed, arrival_spread=config.arrival_spread, duration=config.duration)
    conversation = talks(plans, seed=seed, period=spec.period, mix=config.mix)
    kind: Policy = "window" if family == "window" else "full"
    pool = config.pool_blocks(family)
    core = EngineCore(model, policy=config.policy(kind), num_blocks=pool, block_size=config.block_size)
    n = config.sessions
    trace = WorkloadTrace(start=time.monotonic())
    engine = Engine(
        core=core,
        timing=TimingConfig(
            period=spec.period,
            max_chunk_tokens=config.max_chunk,
            tick_tokens=None,  # the pool is measured here, not the step's cost: no budget holds a frame back
            growth_window=config.growth_window,
        ),
        admission=AdmissionConfig(initial_limit=n, min_limit=n, max_limit=n, queue_timeout=0.0),
        on_tick=trace.ticks.append,
    )
    horizon = max(p.arrival + p.duration for p in plans) + 4 * spec.period
    started = time.monotonic()
    async with engine:
        trace.start = time.monotonic()
        with anyio.CancelScope() as scope:

            def stop_after_stall(elapsed: float) -> None:
                stall = trace.first_stall()
                if stall is not None and elapsed >= stall.time - trace.start + config.after_stall:
                    scope.cancel()

            await run_workload(
                engine,
                plans,
                spec,
                trace,
                horizon=horizon,
                on_round=stop_after_stall,
                load=lambda plan, frame: conversation[plan.index].load(frame),
            )
    ticks = [t for t in trace.ticks if t.time >= trace.start]
    stall = next((t for t in ticks if t.stalled), None)
    stall_at = None if stall is None else stall.time - trace.start
    series = gauge_series(ticks, trace.start)
    bounded = kind == "window"
    replays: dict[float, ForecastScore] = {}
    for w in config.windows:
        replays[w] = score(
            replay(ticks, trace.start, window=w, bounded=bounded), stall_at, leads=config.leads, threshold=config.alarm
        )
    own = replay(ticks, trace.start, window=config.growth_window, bounded=bounded)
    return ForecastRun(
        family=family,
        run=run,
        pool_blocks=pool,
        series=series,
        score=score(series, stall_at, leads=config.leads, threshold=config.alarm),
        replays=replays,
        replay_max_diff=_max_diff(series, own),
        peak_occupancy=max((p.occupancy for p in series), default=0.0),
        seconds=time.monotonic() - started,
        tick_interval=(series[-1].time - series[0].time) / (len(series) - 1) if len(series) > 1 else 0.0,
    )


def _max_diff(a: list[GaugePoint], b: list[GaugePoint]) -> float:
    """The largest gap between two gauge series of the same ticks (inf where one says never and the other not)."""
    worst = 0.0
    for p, q in zip(a, b, strict=True):
        if (p.t_sat is None) != (q.t_sat is None):
            return float("inf")
        if p.t_sat is not None and q.t_sat is not None:
            worst = max(worst, abs(p.t_sat - q.t_sat))
    return worst


def run_forecast(config: ForecastConfig, *, on_run: Callable[[ForecastRun], None] | None = None) -> list[ForecastRun]:
    """Every run of every family, ``config.concurrency`` engines at a time."""
    model = bench_model(config.model)
    runs = [
        functools.partial(_one_run, config, model, family, run)
        for run in range(config.runs)
        for family in config.families
    ]
    results = run_concurrently(runs, concurrency=config.concurrency, on_run=on_run)
    return sorted(results, key=lambda r: (FAMILIES.index(r.family), r.run))


def summarize_forecast(config: ForecastConfig, runs: list[ForecastRun]) -> dict[str, Any]:
    """The JSON report: per family the live gauge's scores, the replayed windows', and every run."""
    out: dict[str, Any] = {}
    for family in config.families:
        mine = [r for r in runs if r.family == family]
        out[family] = {
            "runs": len(mine),
            "collapsed": sum(r.score.collapsed for r in mine),
            "pool_blocks": config.pool_blocks(family),
            "peak_occupancy_max": round(max((r.peak_occupancy for r in mine), default=0.0), 4),
            "live": summarize_scores([r.score for r in mine]),
            "by_window": {f"{w:g}": summarize_scores([r.replays[w] for r in mine]) for w in config.windows},
            "by_alarm": {
                f"{a:g}": summarize_scores([score(r.series, r.score.stall_at, leads=(), threshold=a) for r in mine])[
                    "alarm"
                ]
                for a in config.alarms
            },
            "replay_max_diff_s": max((r.replay_max_diff for r in mine), default=0.0),
            # ticks late behind the period: a loaded machine, which the wall-clock gauge sees as slower growth
            "tick_interval_ms_mean": round(sum(r.tick_interval for r in mine) / len(mine) * 1e3, 2) if mine else None,
            "per_run": [r.as_dict(config.series_every) for r in mine],
        }
    out["config"] = {
        "sessions": config.sessions,
        "runs": config.runs,
        "period_s": config.period,
        "block_size": config.block_size,
        "window": config.window,
        "sinks": config.sinks,
        "pool_blocks": {f: config.pool_blocks(f) for f in config.families},
        "arrival_spread_s": config.arrival_spread,
        "duration_s": list(config.duration),
        "after_stall_s": config.after_stall,
        "growth_window_s": config.growth_window,
        "windows_s": list(config.windows),
        "leads_s": list(config.leads),
        "alarm_s": config.alarm,
        "alarms_s": list(config.alarms),
        "mix": {
            "shares": {"silence": config.mix.silence, "turn": config.mix.turn, "answer": config.mix.answer},
            "seconds": {"silence": config.mix.silence_s, "turn": config.mix.turn_s, "answer": config.mix.answer_s},
            "speech_tokens": config.mix.speech_tokens,
            "answer_tokens": config.mix.answer_tokens,
        },
        "model": config.model,
        "seed": config.seed,
        "gauge": "TickReport.t_sat: engine.stats().t_sat after every tick, free blocks / (N * r), "
        "r measured over growth_window_s",
    }
    return out
