"""``bench admit``: sessions keep arriving; an admission policy sets the cap online.

The policies (``AdmissionConfig.policy``: ``model``, ``aimd``) run side by side in one run,
interleaved run by run on the same arrivals, so both meet the same machine. ``hog`` seconds
of a CPU-bound process (``hog_procs`` of them, each a busy loop) start ``hog_start`` seconds
into each run: the machine slows mid-run, and the JSON shows the cap, the sessions shed with
``LoadShed`` (their ``retry_after``) and the recovery.

With ``kv=window`` the cap should settle at the schedulable N the sweep finds. The machine's
speed drifts over the quarter hour a full run takes, so with ``knee`` (a sweep's config) the
knee is read again beside each run, between the first policy's run and the second's, and each
run is judged against it as well as against the search's ``n_sched``. With
``kv=full`` the same controller sees latency that looks fine while the pool fills (the memory
guard can only check that a block is free now), so it admits more sessions than the pool
can carry to the end of their conversations, and the run stalls.

The controller is told the sweep's criterion: p99 under the deadline (``percentile=0.99``,
``target=1.0``), judged over at least ``min_samples`` frames. The SDK's defaults (p95 under
0.8 x deadline) keep a fifth of the deadline as headroom and settle lower on purpose.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import anyio

from metronome_engine import EngineCore
from metronome_engine.engine import Kernels
from metronome_engine.model import LlamaModel
from metronome_sdk import AdmissionConfig, Engine, TimingConfig

from .admit_trace import frames_after, hog_report, hogging, late_report, silent_frames
from .sweep import SweepConfig, SweepPoint, knee_near
from .workload import (
    Policy,
    StreamExperiment,
    StreamSpec,
    WorkloadTrace,
    bench_model,
    plan_arrivals,
    run_workload,
)

__all__ = [
    "AdmitConfig",
    "AdmitRun",
    "Controller",
    "KneeBeside",
    "budget_in_sessions",
    "cap_bound_by",
    "converged_cap",
    "run_admit",
    "summarize",
]

Controller = Literal["model", "aimd"]
SETTLE_SECONDS = 10.0  # frame p99 is judged after the first 10 s of a run (issue 33), before time_scale


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
    controllers: tuple[Controller, ...] = ("aimd",)
    kvs: tuple[Policy, ...] = ("window", "full")
    hog: float = 0.0  # seconds a CPU-bound process runs mid-run (real seconds); 0: none
    hog_start: float = 20.0  # seconds into the run, before time_scale
    hog_procs: int = 1  # busy processes: each takes one core
    # seconds the run goes on after the hog, before time_scale: the step cost's refit keeps the hog's steps
    # for its 64-step window (32 s at a 0.5 s tick), and the budget term the least of 16 ticks after that
    recovery: float = 50.0

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        if self.runs < 1:
            raise ValueError(f"runs must be >= 1, got {self.runs}")
        if not self.controllers or any(c not in ("model", "aimd") for c in self.controllers):
            raise ValueError(f"controllers must be 'model' and/or 'aimd', got {self.controllers}")
        if not self.kvs or any(k not in ("window", "full") for k in self.kvs):
            raise ValueError(f"kvs must be 'window' and/or 'full', got {self.kvs}")
        if not (math.isfinite(self.hog) and self.hog >= 0) or self.hog_procs < 1:
            raise ValueError(f"hog must be seconds >= 0 and hog_procs >= 1, got {self.hog} and {self.hog_procs}")

    @property
    def horizon(self) -> float:
        """Seconds a run lasts: the planned run, or long enough for the hog and a recovery after it."""
        planned = self.run_seconds * self.time_scale
        if not self.hog:
            return planned
        return max(planned, (self.hog_start + self.recovery) * self.time_scale + self.hog)

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


@dataclass(frozen=True, slots=True)
class KneeBeside:
    """The knee read beside run ``run`` (``sweep.knee_near``): the reference that run's machine met."""

    run: int
    knee: int
    points: list[SweepPoint]

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.run, "knee": self.knee, "points": [p.as_dict() for p in self.points]}


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
    controller: Controller = "aimd"
    p99_after_ms: float | None = None  # frames sent after SETTLE_SECONDS, not shed
    frames_after: int = 0
    late_after: int = 0  # of those, answered past the deadline or never answered
    late: dict[str, Any] = field(default_factory=dict)  # late_report: the late frames by outcome and by second
    shed: list[tuple[float, float]] = field(default_factory=list)  # (seconds, retry_after) of each LoadShed
    silent_frames: int = 0  # frames answered with silence, or never answered without a typed error
    lost_sessions: int = 0  # sessions with such frames: lost without a typed error
    hog: tuple[float, float] | None = None  # (start, end) seconds of the CPU hog
    load_avg: tuple[float, float] | None = None  # 1-minute load average at the run's start and end
    knee: KneeBeside | None = None  # the knee read beside this run (kv=window, when asked)
    bound_by: dict[str, float] = field(default_factory=dict)  # cap_bound_by: which term set the settled cap
    budget: dict[str, int] | None = None  # budget_in_sessions: the tick budget over the same rounds

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "run": self.run,
            "controller": self.controller,
            "n_star": self.n_star,
            "collapsed": self.collapsed,
            "stalled_at_s": self.stalled_at_s,
            "admitted": self.admitted,
            "rejected": self.rejected,
            "peak_sessions": self.peak_sessions,
            "p99_after_10s_ms": self.p99_after_ms,
            "frames_after_10s": self.frames_after,
            "late_after_10s": self.late_after,
            "late_after_10s_by": self.late,
            "shed": len(self.shed),
            "shed_retry_after_s": sorted({round(r, 3) for _, r in self.shed}),
            "silent_frames": self.silent_frames,
            "lost_sessions": self.lost_sessions,
            "load_avg_1m": None if self.load_avg is None else list(self.load_avg),
            "knee_beside": None if self.knee is None else self.knee.knee,
            "cap_bound_by": self.bound_by,
            "budget_sessions_2nd_half": self.budget,
        }
        if self.hog is not None:
            out["hog"] = hog_report(self.cap, self.shed, self.hog)
        return out


def converged_cap(cap: list[tuple[float, int, int]], *, until: float | None = None) -> int:
    """The cap the controller settled at: the median over the second half of the run (before ``until``)."""
    tail = [cap[i][1] for i in _second_half(cap, until)]
    return round(statistics.median(tail)) if tail else 0


def cap_bound_by(
    cap: list[tuple[float, int, int]], bound_by: list[str | None], *, until: float | None = None
) -> dict[str, float]:
    """Over the rounds ``converged_cap`` takes its median of, the share each term set the cap
    (``stats().limit_bound_by``); empty where no term was named (AIMD)."""
    names = [name for i in _second_half(cap, until) if (name := bound_by[i]) is not None]
    return {name: round(names.count(name) / len(names), 3) for name in sorted(set(names))}


def budget_in_sessions(
    cap: list[tuple[float, int, int]], ticks: list[tuple[float, int | None]], per: int, *, until: float | None = None
) -> dict[str, int] | None:
    """The tick budget (``(seconds, tick_tokens)`` a tick) over the second half of the run, in whole
    sessions of ``per`` tokens: its least, median and largest (``None``: no budget). Beside
    ``cap_bound_by``, says whether a cap the budget held sat on a dip or on where it stood."""
    rows = _second_half(cap, until)
    if not rows:
        return None
    start, end = cap[rows[0]][0], cap[rows[-1]][0]
    tokens = [b for t, b in ticks if b is not None and start <= t <= end]
    if not tokens:
        return None
    return {"min": min(tokens) // per, "median": round(statistics.median(tokens)) // per, "max": max(tokens) // per}


def _second_half(cap: list[tuple[float, int, int]], until: float | None) -> list[int]:
    """Indices of ``cap``'s rows in the second half of the run (before ``until``)."""
    rows = [i for i, c in enumerate(cap) if until is None or c[0] <= until]
    if not rows:
        return []
    half = cap[rows[0]][0] + (cap[rows[-1]][0] - cap[rows[0]][0]) / 2
    return [i for i in rows if cap[i][0] >= half]


async def _one(
    config: AdmitConfig,
    model: LlamaModel,
    kind: Policy,
    run: int,
    on_round: Callable[[float], None],
    controller: Controller = "aimd",
) -> AdmitRun:
    spec = config.spec
    scale = config.time_scale
    horizon = config.horizon
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
        admission=replace(config.admission, session_tokens=spec.tokens_per_tick, policy=controller),
        on_tick=trace.ticks.append,
    )
    stop = horizon
    hog: tuple[float, float] | None = None
    load0 = _load_avg()

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

            async def hog_mid_run() -> None:
                nonlocal hog
                await anyio.sleep(config.hog_start * scale)
                began = time.monotonic() - trace.start
                with hogging(config.hog_procs):
                    await anyio.sleep(config.hog)
                hog = (began, time.monotonic() - trace.start)

            tg.start_soon(stopper)
            tg.start_soon(drive)
            if config.hog:
                tg.start_soon(hog_mid_run)
        stats = engine.stats()
    stall = trace.first_stall()
    stalled_at = None if stall is None else stall.time - trace.start
    cap = [(t - trace.start, c, n) for t, c, n in trace.limits]
    p99, after, late = frames_after(trace, SETTLE_SECONDS * scale, spec.period)
    silent, lost = silent_frames(trace, spec.period)
    shed = sorted((r.shed[0] - trace.start, r.shed[1].retry_after) for r in trace.sessions if r.shed is not None)
    load1 = _load_avg()
    return AdmitRun(
        controller=controller,
        p99_after_ms=p99,
        frames_after=after,
        late_after=late,
        late=late_report(trace, SETTLE_SECONDS * scale, spec.period),
        shed=shed,
        silent_frames=silent,
        lost_sessions=lost,
        hog=hog,
        load_avg=None if load0 is None or load1 is None else (load0, load1),
        policy=kind,
        run=run,
        n_star=converged_cap(cap, until=stalled_at),
        bound_by=cap_bound_by(cap, trace.bound_by, until=stalled_at),
        budget=budget_in_sessions(
            cap,
            [(t.time - trace.start, t.tick_tokens) for t in trace.ticks],
            spec.tokens_per_tick,  # a session's tokens a tick, as the model policy counts them
            until=stalled_at,
        ),
        collapsed=stall is not None,
        stalled_at_s=None if stalled_at is None else round(stalled_at, 3),
        admitted=stats.admitted,
        rejected=stats.rejected,
        peak_sessions=max((n for _, _, n in cap), default=0),
        cap=cap,
        occupancy=[(t.time - trace.start, t.used_blocks / t.pool_blocks) for t in trace.ticks],
    )


def _load_avg() -> float | None:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def run_admit(
    config: AdmitConfig,
    *,
    model: LlamaModel | None = None,
    policies: tuple[Policy, ...] | None = None,
    on_round: Callable[[float], None] | None = None,
    on_run: Callable[[AdmitRun], None] | None = None,
    knee: SweepConfig | None = None,
    n_sched: int | None = None,
    on_knee: Callable[[KneeBeside], None] | None = None,
) -> list[AdmitRun]:
    """Each run of each policy; with ``knee`` and ``n_sched``, the window runs' knee read beside them."""
    if (knee is None) != (n_sched is None):
        raise ValueError("knee and n_sched go together: the knee beside a run is searched for from n_sched")
    if n_sched is not None and n_sched < 1:
        raise ValueError(f"n_sched must be >= 1 to read the knee beside a run, got {n_sched}")
    net = model if model is not None else bench_model(config.model)
    runs: list[AdmitRun] = []

    async def main() -> None:
        near = n_sched
        for kind in policies if policies is not None else config.kvs:
            for i in range(config.runs):
                mine: list[AdmitRun] = []
                beside: KneeBeside | None = None
                for j, controller in enumerate(config.controllers):  # interleaved: each run's arrivals, both policies
                    result = await _one(config, net, kind, i, on_round or (lambda _: None), controller)
                    mine.append(result)
                    if j == 0 and kind == "window" and knee is not None and near is not None:
                        # between the two policies' runs: one reading stands beside both
                        found, points = await knee_near(knee, net, start=near)
                        beside = KneeBeside(i, found, points)
                        near = max(1, found)  # the next run's search starts where this one ended
                        if on_knee is not None:
                            on_knee(beside)
                for result in mine:
                    result.knee = beside
                    runs.append(result)
                    if on_run is not None:
                        on_run(result)

    anyio.run(main)
    return runs


def summarize(config: AdmitConfig, runs: list[AdmitRun], n_sched: int, sweep: dict[str, Any] | None) -> dict[str, Any]:
    """``out[kv][controller]``: each policy's runs under each KV policy, beside ``n_sched``."""
    out: dict[str, Any] = {}
    for kind in ("window", "full"):
        by_controller: dict[str, Any] = {}
        for controller in config.controllers:
            mine = [r for r in runs if r.policy == kind and r.controller == controller]
            if mine:
                by_controller[controller] = _entry(config, kind, mine, n_sched)
        if by_controller:
            out[kind] = by_controller
    if sweep is not None:
        out["sweep"] = sweep
    knees = {r.knee.run: r.knee for r in runs if r.knee is not None}
    if knees:
        out["knee_beside"] = [knees[i].as_dict() for i in sorted(knees)]
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
        "controllers": list(config.controllers),
        "hog": {
            "seconds": config.hog,
            "start_s": config.hog_start * config.time_scale,
            "procs": config.hog_procs,
            "recovery_s": config.recovery * config.time_scale,
        }
        if config.hog
        else None,
        "horizon_s": config.horizon,
        "n_star": "median admission cap over the second half of the run (before the first stall)",
        "knee_beside": "the knee read again between each run's first and second policy, stepping one count at a "
        "time from the last knee with the search's criterion (a count holds when one of two 10 s readings meets "
        "the deadline)",
        "p99_after_10s_ms": "p99 of the frames sent after the first 10 s (x time_scale), shed sessions' left out; a "
        "frame never answered counts with the time it had waited",
    }
    return out


def _entry(config: AdmitConfig, kind: Policy, mine: list[AdmitRun], n_sched: int) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "n_star": round(statistics.median(r.n_star for r in mine)),
        "runs": len(mine),
        "collapsed": sum(r.collapsed for r in mine),
        "peak_sessions": max(r.peak_sessions for r in mine),
        "shed": sum(len(r.shed) for r in mine),
        "lost_sessions": sum(r.lost_sessions for r in mine),
        "per_run": [r.as_dict() for r in mine],
    }
    if kind == "window":
        entry["n_sched"] = n_sched
        errs = [abs(r.n_star - n_sched) / n_sched for r in mine] if n_sched else []
        entry["n_star_rel_err"] = round(abs(entry["n_star"] - n_sched) / n_sched, 4) if n_sched else None
        entry["n_star_rel_err_max"] = round(max(errs), 4) if errs else None
        entry["runs_n_star_within_10pct"] = sum(1 for r in mine if _n_star_within(r, n_sched))
        entry["runs_peak_within_10pct"] = sum(1 for r in mine if _peak_within(r, n_sched))
        p99s = [r.p99_after_ms for r in mine if r.p99_after_ms is not None]
        entry["p99_after_10s_ms_max"] = max(p99s) if p99s else None
        entry["runs_p99_after_10s_under_deadline"] = sum(1 for p in p99s if p <= config.period * 1e3)
        if all(r.knee is not None for r in mine):
            # the same checks against the knee read beside each run (the machine it met)
            knees = [r.knee.knee for r in mine if r.knee is not None]
            entry["knee_beside"] = knees
            entry["runs_n_star_within_10pct_of_knee_beside"] = sum(
                1 for r, k in zip(mine, knees, strict=True) if _n_star_within(r, k)
            )
            entry["runs_peak_within_10pct_of_knee_beside"] = sum(
                1 for r, k in zip(mine, knees, strict=True) if _peak_within(r, k)
            )
    else:
        entry["pool_carries_sessions"] = round(config.pool_carries, 2)
    return entry


def _n_star_within(run: AdmitRun, knee: int) -> bool:
    """Issue 33's check: the run's N* within 10 % of ``knee`` (never, against a knee of 0)."""
    return bool(knee) and abs(run.n_star - knee) / knee <= 0.10


def _peak_within(run: AdmitRun, knee: int) -> bool:
    """Issue 33's check: the run's peak of sessions open at most 10 % above ``knee`` (never, against a knee of 0)."""
    return bool(knee) and run.peak_sessions <= 1.10 * knee
