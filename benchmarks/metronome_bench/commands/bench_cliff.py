"""``metronome bench cliff``: how often the unbounded KV falls off the cliff, and what the t_sat gauge said."""

from __future__ import annotations

import argparse
import time
from typing import Any

from metronome_sdk.cli import Command

from ._common import add_common, machine, positive_float, save_report, setup_threads
from ._output import emit_json, print_table, progress_bar


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
    p.add_argument("--alarm", type=positive_float, default=10.0, help="the alarm scored: t_sat under this many s")
    add_common(p)


def _run(args: argparse.Namespace) -> int:
    from ..cliff import CliffConfig, run_cliff, summarize
    from ..plots import plot_cliff, plot_silent

    setup_threads(args)
    runs, scale = args.runs, args.time_scale
    if args.quick:
        # eight runs keep the gauge's median error from resting on two short ones (silent runs only count frames)
        runs = min(runs, 4 if args.silent else 8)
    config = CliffConfig(
        sessions=args.sessions,
        runs=runs,
        seed=args.seed,
        model=args.model,
        silent=args.silent,
        concurrency=args.concurrency or (5 if not args.silent else 2 if args.quick else 1),
        time_scale=scale,
        alarm=args.alarm,
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
    full = report["full"]
    print_table(
        [
            "policy",
            "runs",
            "collapsed",
            "gauge rel err 1 s before (median)",
            "alarm before collapse",
            "false alarms",
            "peak occupancy",
        ],
        [_policy_row(kind, report[kind]) for kind in ("full", "window")],
    )
    print()
    print_table(
        ["run", "stalled at s", "gauge 1 s before", "left then s", "rel err", "alarm at s", "alarm lead s"],
        [_run_row(r) for r in full["per_run"] if r["collapsed"]],
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


def _policy_row(kind: str, entry: dict[str, Any]) -> list[Any]:
    f = entry["forecast"]
    one = f["leads"].get(_first_lead(f["leads"]), {})
    alarm = f["alarm"]
    return [
        kind,
        entry["runs"],
        entry["collapsed"],
        one.get("rel_err_median"),
        f"{alarm['fired_before_collapse']} / {alarm['collapses']}",
        f"{alarm['false_alarm_runs']} / {alarm['runs_without_collapse']}",
        entry["peak_occupancy_max"],
    ]


def _run_row(r: dict[str, Any]) -> list[Any]:
    f = r["forecast"]
    first = f["leads"][_first_lead(f["leads"])] or {}
    return [
        r["run"],
        r["stalled_at_s"],
        first.get("gauge_s"),
        first.get("truth_s"),
        first.get("rel_err"),
        f["alarm"]["first_s"],
        f["alarm"]["lead_s"],
    ]


def _first_lead(leads: dict[str, Any]) -> str:
    return min(leads, key=float)


BENCH_CLIFF = Command(
    "bench", "cliff", "unbounded vs bounded KV: runs that stall, and what the t_sat gauge said before", _add, _run
)
