"""``metronome bench forecast``: the live t_sat gauge scored as a forecast, on traffic that varies."""

from __future__ import annotations

import argparse
import time
from typing import Any

from metronome_sdk.cli import Command

from ._common import add_common, machine, positive_float, save_report, setup_threads
from ._output import emit_json, print_table, progress_bar


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=20, help="runs per family: full, calm, window (default 20)")
    p.add_argument("--sessions", type=int, default=8, help="sessions per run (default 8)")
    p.add_argument("--pool", type=int, default=560, help="blocks in the full runs' pool (default 560)")
    p.add_argument("--alarm", type=positive_float, default=10.0, help="the alarm scored: t_sat under this many s")
    p.add_argument(
        "--growth-window",
        type=positive_float,
        default=None,
        help="seconds the engine measures r over (default: TimingConfig's)",
    )
    p.add_argument("--concurrency", type=int, default=5, help="runs at once, one engine each (default 5)")
    p.add_argument(
        "--series-every", type=int, default=1, help="keep every k-th tick's gauge in the JSON (default 1: all)"
    )
    add_common(p)


def _run(args: argparse.Namespace) -> int:
    from metronome_sdk import TimingConfig

    from ..forecast_runs import ForecastConfig, run_forecast, summarize_forecast
    from ..plots import plot_forecast

    setup_threads(args)
    scale = args.time_scale
    runs = min(args.runs, 2) if args.quick else args.runs
    spread, duration, pool = 15.0 * scale, (15.0 * scale, 50.0 * scale), round(args.pool * scale)
    if args.quick:  # shorter runs: collapses within 15 s, so the longest leads go unscored
        spread, duration, pool = spread * 0.4, (duration[0] * 0.5, duration[1] * 0.5), round(pool * 0.45)
    config = ForecastConfig(
        sessions=args.sessions,
        runs=runs,
        pool=pool,
        arrival_spread=spread,
        duration=duration,
        alarm=args.alarm,
        growth_window=args.growth_window or TimingConfig().growth_window,
        seed=args.seed,
        concurrency=args.concurrency,
        series_every=args.series_every,
    )
    started = time.monotonic()
    with progress_bar(len(config.families) * runs, "bench forecast") as bar:
        bar.unit = "run"
        results = run_forecast(config, on_run=lambda _: bar.update(1))
    report = summarize_forecast(config, results)
    report["plots"] = [str(p) for p in plot_forecast(results, report, args.out)]
    report["machine"] = machine()
    report["seconds"] = round(time.monotonic() - started, 1)
    saved = save_report(report, args.out, "forecast")
    if args.json:
        emit_json(report)
        return 0
    leads = [f"{lead:g}" for lead in config.leads]
    print_table(
        ["family", "runs", "collapsed", "pool", "tick ms", "alarm before collapse", "min alarm lead s", "false alarms"],
        [_family_row(f, report[f]) for f in config.families],
    )
    print("\nmedian relative error of the gauge, kv=full, at each lead before the stall (runs scored, misses):")
    print_table(
        ["growth window s", *(f"{lead} s" for lead in leads)],
        [
            _window_row(w, s, leads, live=float(w) == config.growth_window)
            for w, s in report["full"]["by_window"].items()
        ],
    )
    print("\nthe alarm t_sat < A on the live gauge: fired before the collapse (full), false alarms (calm, window):")
    print_table(
        [
            "A s",
            "full: before collapse",
            "min lead s",
            "median lead s",
            "calm: false alarm runs",
            "window: false alarms",
        ],
        [_alarm_row(a, report, config.families) for a in report["full"]["by_alarm"]] if "full" in report else [],
    )
    print(f"\nplots: {', '.join(report['plots'])}; report: {saved}  ({report['seconds']} s)")
    return 0


def _family_row(family: str, entry: dict[str, Any]) -> list[Any]:
    alarm = entry["live"]["alarm"]
    return [
        family,
        entry["runs"],
        entry["collapsed"],
        entry["pool_blocks"],
        entry["tick_interval_ms_mean"],
        f"{alarm['fired_before_collapse']} / {alarm['collapses']}",
        alarm["lead_s_min"],
        f"{alarm['false_alarm_runs']} / {alarm['runs_without_collapse']}",
    ]


def _window_row(window: str, summary: dict[str, Any], leads: list[str], *, live: bool) -> list[Any]:
    cells: list[Any] = [f"{window} (engine)" if live else window]
    for lead in leads:
        s = summary["leads"][lead]
        err = "-" if s["rel_err_median"] is None else f"{s['rel_err_median']:.3f}"
        cells.append(f"{err} ({s['runs']}, {s['misses']})")
    return cells


def _alarm_row(a: str, report: dict[str, Any], families: tuple[str, ...]) -> list[Any]:
    full = report["full"]["by_alarm"][a]
    row: list[Any] = [
        a,
        f"{full['fired_before_collapse']} / {full['collapses']}",
        full["lead_s_min"],
        full["lead_s_median"],
    ]
    for family in ("calm", "window"):
        if family in families:
            got = report[family]["by_alarm"][a]
            row.append(f"{got['false_alarm_runs']} / {got['runs_without_collapse']}")
        else:
            row.append("-")
    return row


BENCH_FORECAST = Command(
    "bench", "forecast", "the live t_sat gauge as a forecast: error at each lead time, alarms, false alarms", _add, _run
)
