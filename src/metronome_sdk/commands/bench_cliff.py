"""``metronome bench cliff``: how often the unbounded KV falls off the cliff, and when (t_sat)."""

from __future__ import annotations

import argparse
import time

from ._base import Command, emit_json, print_table, progress_bar
from ._bench_common import add_common, machine, save_report, setup_threads


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=20, help="runs per policy (default 20)")
    p.add_argument("--sessions", type=int, default=8, help="sessions per run (default 8)")
    p.add_argument(
        "--silent",
        action="store_true",
        help="legacy mode: stalled frames answered on time, empty (what a latency dashboard sees)",
    )
    p.add_argument(
        "--model",
        default="small",
        help="'small' (random 2-layer Llama, default: ticks stay on time) or a real model name",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="runs at once, one engine each (default 5; 1 with --silent, whose latencies must be the engine's)",
    )
    add_common(p)


def _run(args: argparse.Namespace) -> int:
    from ..bench.cliff import CliffConfig, run_cliff, summarize
    from ..bench.plots import plot_cliff, plot_silent

    setup_threads(args)
    runs, scale = args.runs, args.time_scale
    if args.quick:
        # a t_sat observed a few ticks after the prediction is off by a tick's share of it: eight
        # runs keep the median from resting on two short ones (the silent runs only count frames)
        runs = min(runs, 4 if args.silent else 8)
    config = CliffConfig(
        sessions=args.sessions,
        runs=runs,
        seed=args.seed,
        model=args.model,
        silent=args.silent,
        concurrency=args.concurrency or (5 if not args.silent else 2 if args.quick else 1),
        time_scale=scale,
    )
    started = time.monotonic()
    with progress_bar(2 * runs, "bench cliff") as bar:
        bar.unit = "run"
        results = run_cliff(config, on_run=lambda _: bar.update(1))
    report = summarize(config, results)
    plots = plot_cliff(results, args.out)
    if args.silent:
        plots.append(plot_silent(results, config.spec.period * 1e3, args.out))
    report["plots"] = [str(p) for p in plots]
    report["machine"] = machine()
    report["seconds"] = round(time.monotonic() - started, 1)
    saved = save_report(report, args.out, "cliff")
    if args.json:
        emit_json(report)
        return 0
    full, window = report["full"], report["window"]
    print_table(
        ["policy", "runs", "collapsed", "t_sat median rel err", "peak occupancy"],
        [
            ["full", full["runs"], full["collapsed"], full["t_sat_rel_err_median"], full["peak_occupancy_max"]],
            [
                "window",
                window["runs"],
                window["collapsed"],
                window["t_sat_rel_err_median"],
                window["peak_occupancy_max"],
            ],
        ],
    )
    print()
    print_table(
        ["run", "predicted at s", "rho0", "N", "t_sat predicted s", "t_sat observed s", "rel err"],
        [
            [
                r["run"],
                r["predicted_at_s"],
                r["predicted_rho0"],
                r["predicted_sessions"],
                r["t_sat_predicted_s"],
                r["t_sat_observed_s"],
                r["t_sat_rel_err"],
            ]
            for r in full["per_run"]
            if r["collapsed"]
        ],
    )
    if args.silent:
        s = full["silent"]
        print(
            f"\nsilent mode, kv=full: {s['frames_answered']} frames answered on time or late, "
            f"{s['frames_empty']} of them empty; deadline misses {s['deadline_misses']}; "
            f"worst run's dashboard p99 {s['dashboard_p99_ms_max']} ms"
        )
    print(f"\nplots: {', '.join(report['plots'])}; report: {saved}  ({report['seconds']} s)")
    return 0


BENCH_CLIFF = Command(
    "bench", "cliff", "unbounded vs bounded KV: runs that stall, and the t_sat prediction", _add, _run
)
