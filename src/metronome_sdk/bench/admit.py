"""``bench admit``: sessions keep arriving; the AIMD controller sets the cap online.

With ``kv=window`` the cap should settle at the schedulable N the sweep finds. With
``kv=full`` the same controller sees latency that looks fine while the pool fills (the memory
guard can only check that a block is free now), so it admits more sessions than the pool
can carry to the end of their conversations, and the run stalls.

The controller is told the sweep's criterion: p99 under the deadline (``percentile=0.99``,
``target=1.0``), judged over at least ``min_samples`` frames. The SDK's defaults (p95 under
0.8 x deadline) keep a fifth of the deadline as headroom and settle lower on purpose.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from metronome_engine import EngineCore
from metronome_engine.engine import Kernels
from metronome_engine.model import LlamaModel
from metronome_sdk import AdmissionConfig, Engine, TimingConfig

from .workload import (
    Policy,
    StreamExperiment,
    StreamSpec,
    WorkloadTrace,
    bench_model,
    plan_arrivals,
    run_workload,
)

__all__ = ["AdmitConfig", "AdmitRun", "converged_cap", "run_admit", "summarize"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmitConfig(StreamExperiment):
    period: float = 0.5
    tokens_per_frame: int = 8
    window: int = 32
    sinks: int = 4
    block_size: int = 16
    pool_sessions: int = 40  # the pool holds this many sessions at the window's bound
    window_pool_sessions: int | None = None  # the window policy's pool, when larger (sized_for)
    run_seconds: float = 75.0  # before time_scale
    arrival_rate: float = 1.0  # sessions per second
    duration: tuple[float, float] = (30.0, 60.0)  # seconds, before time_scale
    first_sessions: int = 4
    admission: AdmissionConfig = field(  # initial_limit None: the cap starts from the engine's calibration
        default_factory=lambda: AdmissionConfig(
            percentile=0.99, target=1.0, min_samples=32, interval=1.0, queue_timeout=0.0
        )
    )
    after_stall_seconds: float = 8.0  # a collapsed full run goes on this long, then stops
    runs: int = 1
    seed: int = 0
    model: str = "smollm2-135m-instruct"
    time_scale: float = 1.0
    kernels: Kernels = "auto"

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        if self.runs < 1:
            raise ValueError(f"runs must be >= 1, got {self.runs}")

    def sized_for(self, n_sched: int) -> AdmitConfig:
        """Demand and pool that let latency, not memory or a lack of callers, set the window's cap.

        Sessions arrive fast enough that about twice ``n_sched`` are open at once (the controller
        grows its cap only under demand), and the window policy's pool holds twice ``n_sched`` at
        the window's bound (its memory guard's limit sits above the knee). The full policy keeps
        the experiment's pool (``pool_sessions``), which its sessions outgrow: the wall it meets.
        """
        mean = sum(self.duration) / 2 * self.time_scale
        return replace(
            self,
            window_pool_sessions=max(self.pool_sessions, 2 * n_sched),
            arrival_rate=max(self.arrival_rate, 2 * n_sched / mean),
        )

    def pool_for(self, kind: Policy) -> int:
        """Blocks of the pool a run of policy ``kind`` gets."""
        sessions = self.window_pool_sessions if kind == "window" and self.window_pool_sessions else self.pool_sessions
        return sessions * self.session_bound

    @property
    def spec(self) -> StreamSpec:
        return StreamSpec(period=self.period, tokens_per_frame=self.tokens_per_frame, lead=0.05 * self.period)

    @property
    def pool_blocks(self) -> int:
        return self.pool_sessions * self.session_bound

    @property
    def pool_carries(self) -> float:
        """Sessions of the mean planned length the pool holds to their end under ``kv=full``."""
        mean = sum(self.duration) / 2 * self.time_scale
        tokens = self.spec.tokens_per_tick * mean / self.period
        return self.pool_blocks / (tokens / self.block_size)


@dataclass(slots=True)
class AdmitRun:
    policy: Policy
    run: int
    n_star: int
    collapsed: bool
    stalled_at_s: float | None
    admitted: int
    rejected: int
    peak_sessions: int
    cap: list[tuple[float, int, int]]  # (seconds, cap, sessions open)
    occupancy: list[tuple[float, float]]

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "n_star": self.n_star,
            "collapsed": self.collapsed,
            "stalled_at_s": self.stalled_at_s,
            "admitted": self.admitted,
            "rejected": self.rejected,
            "peak_sessions": self.peak_sessions,
        }


def converged_cap(cap: list[tuple[float, int, int]], *, until: float | None = None) -> int:
    """The cap the controller settled at: the median over the second half of the run (before ``until``)."""
    rows = [c for c in cap if until is None or c[0] <= until]
    if not rows:
        return 0
    half = rows[0][0] + (rows[-1][0] - rows[0][0]) / 2
    tail = [c[1] for c in rows if c[0] >= half]
    return round(statistics.median(tail))


async def _one(
    config: AdmitConfig, model: LlamaModel, kind: Policy, run: int, on_round: Callable[[float], None]
) -> AdmitRun:
    spec = config.spec
    scale = config.time_scale
    horizon = config.run_seconds * scale
    lo, hi = config.duration
    plans = plan_arrivals(
        rate=config.arrival_rate,
        horizon=horizon,
        seed=config.seed * 100_003 + run,
        duration=(lo * scale, hi * scale),
        first=config.first_sessions,
    )
    core = EngineCore(
        model,
        policy=config.policy(kind),
        num_blocks=config.pool_for(kind),
        block_size=config.block_size,
        kernels=config.kernels,
    )
    trace = WorkloadTrace(start=time.monotonic())
    engine = Engine(
        core=core,
        timing=TimingConfig(period=spec.period, max_chunk_tokens=spec.tokens_per_tick),
        # a streaming session appends its frame's tokens and its output each tick: the calibrated cap counts that
        admission=replace(config.admission, session_tokens=spec.tokens_per_tick),
        on_tick=trace.ticks.append,
    )
    stop = horizon

    def watch(elapsed: float) -> None:
        nonlocal stop
        stall = trace.first_stall()
        if stall is not None:
            stop = min(stop, stall.time - trace.start + config.after_stall_seconds * scale)
        on_round(elapsed)

    async with engine:
        trace.start = time.monotonic()
        async with anyio.create_task_group() as tg:

            async def stopper() -> None:
                while time.monotonic() - trace.start < stop:
                    await anyio.sleep(spec.period)
                tg.cancel_scope.cancel()

            async def drive() -> None:
                await run_workload(engine, plans, spec, trace, horizon=horizon, on_round=watch)
                tg.cancel_scope.cancel()

            tg.start_soon(stopper)
            tg.start_soon(drive)
        stats = engine.stats()
    stall = trace.first_stall()
    stalled_at = None if stall is None else stall.time - trace.start
    cap = [(t - trace.start, c, n) for t, c, n in trace.limits]
    return AdmitRun(
        policy=kind,
        run=run,
        n_star=converged_cap(cap, until=stalled_at),
        collapsed=stall is not None,
        stalled_at_s=None if stalled_at is None else round(stalled_at, 3),
        admitted=stats.admitted,
        rejected=stats.rejected,
        peak_sessions=max((n for _, _, n in cap), default=0),
        cap=cap,
        occupancy=[(t.time - trace.start, t.used_blocks / t.pool_blocks) for t in trace.ticks],
    )


def run_admit(
    config: AdmitConfig,
    *,
    model: LlamaModel | None = None,
    policies: tuple[Policy, ...] = ("window", "full"),
    on_round: Callable[[float], None] | None = None,
    on_run: Callable[[AdmitRun], None] | None = None,
) -> list[AdmitRun]:
    net = model if model is not None else bench_model(config.model)
    runs: list[AdmitRun] = []

    async def main() -> None:
        for kind in policies:
            for i in range(config.runs):
                result = await _one(config, net, kind, i, on_round or (lambda _: None))
                runs.append(result)
                if on_run is not None:
                    on_run(result)

    anyio.run(main)
    return runs


def summarize(config: AdmitConfig, runs: list[AdmitRun], n_sched: int, sweep: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("window", "full"):
        mine = [r for r in runs if r.policy == kind]
        if not mine:
            continue
        entry: dict[str, Any] = {
            "n_star": round(statistics.median(r.n_star for r in mine)),
            "runs": len(mine),
            "collapsed": sum(r.collapsed for r in mine),
            "peak_sessions": max(r.peak_sessions for r in mine),
            "per_run": [r.as_dict() for r in mine],
        }
        if kind == "window":
            entry["n_sched"] = n_sched
            entry["n_star_rel_err"] = round(abs(entry["n_star"] - n_sched) / n_sched, 4) if n_sched else None
        else:
            entry["pool_carries_sessions"] = round(config.pool_carries, 2)
        out[kind] = entry
    if sweep is not None:
        out["sweep"] = sweep
    out["config"] = {
        "period_s": config.period,
        "tokens_per_tick": config.spec.tokens_per_tick,
        "window": config.window,
        "sinks": config.sinks,
        "block_size": config.block_size,
        "pool_blocks": {"window": config.pool_for("window"), "full": config.pool_for("full")},
        "memory_guard_limit": config.window_pool_sessions or config.pool_sessions,  # the window run's
        "run_seconds": config.run_seconds * config.time_scale,
        "arrival_rate_per_s": round(config.arrival_rate, 3),
        "duration_s": [d * config.time_scale for d in config.duration],
        "admission": {
            "initial_limit": config.admission.initial_limit,  # None: from the engine's calibration
            "percentile": config.admission.percentile,
            "target": config.admission.target,
            "min_samples": config.admission.min_samples,
            "interval_s": config.admission.interval,
            "decrease": config.admission.decrease,
        },
        "model": config.model,
        "kernels": config.kernels,
        "time_scale": config.time_scale,
        "n_star": "median admission cap over the second half of the run (before the first stall)",
    }
    return out
