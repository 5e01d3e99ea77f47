"""PNG plots of the experiments (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .admit import AdmitRun
    from .cliff import CliffRun
    from .forecast import GaugePoint
    from .forecast_runs import ForecastRun
    from .sweep import SweepPoint

__all__ = ["plot_admit", "plot_cliff", "plot_forecast", "plot_silent", "plot_sweep"]

_COLORS = {"full": "tab:red", "window": "tab:blue"}


def _pyplot() -> Any:
    import matplotlib  # a dependency of metronome-bench, imported late: a run's start stays quick

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    _pyplot().close(fig)
    return path


def plot_cliff(runs: list[CliffRun], out: Path) -> list[Path]:
    """Pool occupancy over time for every run, and predicted against observed saturation time."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for r in runs:
        if not r.occupancy:
            continue
        t, occ = zip(*r.occupancy, strict=True)
        ax.plot(t, occ, color=_COLORS[r.policy], alpha=0.35, lw=1)
        if r.stalled_at is not None:
            ax.plot([r.stalled_at], [1.0], "x", color="black", ms=5)
    for kind in ("full", "window"):
        n = sum(r.collapsed for r in runs if r.policy == kind)
        total = sum(1 for r in runs if r.policy == kind)
        ax.plot([], [], color=_COLORS[kind], label=f"kv={kind}: {n}/{total} runs stalled")
    ax.plot([], [], "x", color="black", label="first stall")
    ax.set(xlabel="seconds", ylabel="pool occupancy", ylim=(0, 1.05), title="The cliff: pool occupancy per run")
    ax.legend(loc="lower right", fontsize=8)
    paths = [_save(fig, out / "cliff_occupancy.png")]

    fig, ax = plt.subplots(figsize=(4.2, 4))
    _gauge_against_truth(ax, [(r.gauge, r.stalled_at) for r in runs if r.policy == "full"])
    ax.set(title="The t_sat gauge, kv=full")
    paths.append(_save(fig, out / "cliff_tsat.png"))
    return paths


def _gauge_against_truth(ax: Any, runs: list[tuple[list[GaugePoint], float | None]]) -> None:
    """Every tick before a stall: what the gauge said against the seconds that were left."""
    xs: list[float] = []
    ys: list[float] = []
    for series, stall in runs:
        if stall is None:
            continue
        for p in series:
            if p.time < stall and p.t_sat is not None and p.t_sat > 0:
                xs.append(stall - p.time)
                ys.append(p.t_sat)
    if xs:
        ax.scatter(xs, ys, color=_COLORS["full"], s=3, alpha=0.3)
        lo, hi = min(*xs, *ys), max(*xs, *ys)
        ax.plot([lo, hi], [lo, hi], color="gray", lw=1, ls="--", label="gauge = time left")
        ax.set(xscale="log", yscale="log")
        ax.legend(fontsize=8)
    ax.set(xlabel="seconds left until the first stall", ylabel="t_sat gauge (s)")


def plot_forecast(runs: list[ForecastRun], report: dict[str, Any], out: Path) -> list[Path]:
    """The forecast's error against lead time, per growth window; the gauge against the time left."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    full = report["full"]
    live = report["config"]["growth_window_s"]
    for w, summary in full["by_window"].items():
        leads = [
            (float(k), v["rel_err_median"]) for k, v in summary["leads"].items() if v["rel_err_median"] is not None
        ]
        if not leads:
            continue
        x, y = zip(*leads, strict=True)
        own = float(w) == live
        ax.plot(
            x, y, "o-" if own else ".:", lw=2 if own else 1, label=f"window {w} s" + (" (the engine's)" if own else "")
        )
    ax.axhline(0.15, color="black", ls="--", lw=1, label="15 %")
    ax.set(xlabel="lead time before the first stall (s)", ylabel="median relative error", xscale="log")
    ax.set(title="t_sat as a forecast, kv=full")
    ax.legend(fontsize=7)
    paths = [_save(fig, out / "forecast_error.png")]
    fig, ax = plt.subplots(figsize=(4.2, 4))
    _gauge_against_truth(ax, [(r.series, r.score.stall_at) for r in runs if r.family == "full"])
    ax.set(title="The live gauge, kv=full")
    paths.append(_save(fig, out / "forecast_gauge.png"))
    return paths


def plot_silent(runs: list[CliffRun], deadline_ms: float, out: Path) -> Path:
    """Silent mode: the latency dashboard stays green while frames come back empty."""
    plt = _pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.2))
    full = [r for r in runs if r.policy == "full"]
    a1.bar(range(len(full)), [r.dashboard_p99_ms or 0.0 for r in full], color="tab:green")
    a1.axhline(deadline_ms, color="black", ls="--", lw=1, label="deadline")
    a1.set(xlabel="run (kv=full)", ylabel="p99 frame latency (ms)", title="What the dashboard shows")
    a1.legend(fontsize=8)
    for r in full:
        if r.empty_share:
            t, share = zip(*r.empty_share, strict=True)
            a2.plot(t, share, color=_COLORS["full"], alpha=0.4)
    a2.set(xlabel="seconds", ylabel="share of frames answered empty", ylim=(0, 1.05), title="What users hear")
    return _save(fig, out / "cliff_silent.png")


def plot_sweep(points: list[SweepPoint], deadline_ms: float, n_sched: int | None, out: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for kind in ("window", "full"):
        mine = sorted((p for p in points if p.policy == kind), key=lambda p: p.n)
        if not mine:
            continue
        ns = [p.n for p in mine]
        ax.plot(ns, [p.p99_ms for p in mine], "o-", color=_COLORS[kind], label=f"kv={kind} p99")
        ax.plot(ns, [p.p50_ms for p in mine], "s:", color=_COLORS[kind], alpha=0.6, label=f"kv={kind} p50")
        for p in mine:
            if p.stalled:
                ax.annotate(
                    "stall", (p.n, p.p99_ms), fontsize=7, color=_COLORS[kind], xytext=(3, 3), textcoords="offset points"
                )
    ax.axhline(deadline_ms, color="black", ls="--", lw=1, label="deadline")
    if n_sched:
        ax.axvline(n_sched, color="gray", ls=":", lw=1, label=f"n_sched = {n_sched}")
    ax.set(xlabel="concurrent sessions N", ylabel="per-frame latency (ms)", yscale="log", title="Latency against load")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, out / "sweep_latency.png")


def plot_admit(runs: list[AdmitRun], n_sched: int | None, out: Path) -> Path:
    plt = _pyplot()
    kinds = [k for k in ("window", "full") if any(r.policy == k for r in runs)]
    controllers = list(dict.fromkeys(r.controller for r in runs))
    fig, axes = plt.subplots(
        len(controllers), len(kinds), figsize=(5 * len(kinds), 3.4 * len(controllers)), squeeze=False
    )
    for row, controller in zip(axes, controllers, strict=True):
        for ax, kind in zip(row, kinds, strict=True):
            for r in (r for r in runs if r.policy == kind and r.controller == controller):
                t, cap, open_ = zip(*r.cap, strict=True) if r.cap else ((), (), ())
                first = r.run == 0
                ax.step(t, cap, where="post", color=_COLORS[kind], label="admission cap" if first else None)
                ax.step(t, open_, where="post", color="gray", alpha=0.7, label="sessions open" if first else None)
                if r.stalled_at_s is not None:
                    ax.axvline(r.stalled_at_s, color="black", lw=1, label="first stall" if first else None)
                if r.hog is not None:
                    ax.axvspan(*r.hog, color="orange", alpha=0.08, label="CPU hog" if first else None)
                if kind == "full" and r.occupancy:
                    tw = ax.twinx()
                    to, occ = zip(*r.occupancy, strict=True)
                    tw.plot(to, occ, color=_COLORS["full"], alpha=0.3, lw=1)
                    tw.set(ylim=(0, 1.05), ylabel="pool occupancy (light)")
            if n_sched:
                ax.axhline(n_sched, color="black", ls="--", lw=1, label=f"sweep n_sched = {n_sched}")
            ax.set(xlabel="seconds", ylabel="sessions", title=f"{controller} admission, kv={kind}")
            ax.legend(fontsize=7, loc="upper left")
    return _save(fig, out / "admit_cap.png")
