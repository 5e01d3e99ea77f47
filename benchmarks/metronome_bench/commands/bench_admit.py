"""``metronome bench admit``: admission policies online, side by side, beside the sweep's schedulable N."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from metronome_sdk.cli import Command

from ._common import add_common, add_isa, machine, positive_float, save_report, select_isa, setup_threads
from ._output import emit_json, print_table, progress_bar
from .bench_sweep import add_sweep_arguments, sweep_config


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--n-sched",
        type=int,
        default=None,
        help="the schedulable N from a sweep; without it a window-only sweep runs first",
    )
    p.add_argument(
        "--sweep",
        type=Path,
        default=None,
        help="take n_sched from a `bench sweep` report (bench-out/sweep.json) instead of sweeping",
    )
    p.add_argument("--runs", type=int, default=1, help="runs per policy (default 1)")
    p.add_argument(
        "--policy",
        type=_names("--policy", ("model", "aimd")),
        default=("model",),
        help="admission policies, comma-separated, run side by side on the same arrivals (default model; "
        "model,aimd compares them)",
    )
    p.add_argument(
        "--kv",
        type=_names("--kv", ("window", "full")),
        default=("window", "full"),
        help="KV policies (default window,full; full shows the cliff the memory guard cannot see)",
    )
    p.add_argument(
        "--hog",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="start a CPU-bound process 20 s into each run (x --time-scale) for SECONDS: the machine slows mid-run",
    )
    p.add_argument("--hog-procs", type=int, default=1, help="busy processes the hog starts, one core each (default 1)")
    p.add_argument(
        "--recovery",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="seconds each run goes on after the hog (x --time-scale; default 50: the step cost's refit keeps "
        "the hog's steps for its 64-step window, 32 s at a 0.5 s tick)",
    )
    p.add_argument(
        "--knee-beside",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="read the knee again beside each window run, from n_sched one count at a time (default on; about "
        "40 s a run): the machine's speed drifts over a full run",
    )
    add_isa(p)
    add_sweep_arguments(p)
    add_common(p)


def _names(flag: str, allowed: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
        if not names or any(n not in allowed for n in names):
            raise argparse.ArgumentTypeError(f"{flag} takes {' and/or '.join(allowed)}, comma-separated; got {text!r}")
        return names

    return parse


def _run(args: argparse.Namespace) -> int:
    from ..admit import AdmitConfig, KneeBeside, run_admit, summarize
    from ..plots import plot_admit
    from ..sweep import SweepConfig, run_sweep
    from ..sweep import summarize as summarize_sweep
    from ..workload import bench_model

    capability = select_isa(args.isa)  # before anything computes
    setup_threads(args)
    started = time.monotonic()
    model = bench_model(args.model)
    sweep: dict[str, Any] | None = None
    if args.n_sched is not None and args.sweep is not None:
        raise ValueError("give --n-sched or --sweep, not both")
    sc = sweep_config(args, policies=("window",))  # the search's readings, and the knee's beside each run
    assert isinstance(sc, SweepConfig)
    if args.sweep is not None:
        try:
            sweep = json.loads(args.sweep.read_text(encoding="utf-8"))
            n_sched = int(sweep["n_sched"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"--sweep {args.sweep} is not a readable `bench sweep` report: {exc}") from exc
    elif args.n_sched is None:
        from ..sweep import search_n_sched

        with progress_bar(len(sc.ns) * (sc.warmup_ticks + sc.measured_ticks + 1), "bench admit: sweep") as bar:
            bar.unit = "tick"
            if args.ns is None:  # search for the knee: a fixed list says nothing past its largest N
                bar.total = None
                points = search_n_sched(sc, model=model, on_round=lambda: bar.update(1))
                sc = replace(sc, ns=tuple(sorted(p.n for p in points)))
            else:
                points = run_sweep(sc, model=model, on_round=lambda: bar.update(1))
        sweep = summarize_sweep(sc, points)
        sweep["searched"] = args.ns is None
        n_sched = int(sweep["n_sched"])
    else:
        if args.n_sched < 1:
            raise ValueError(f"--n-sched must be >= 1, got {args.n_sched}")
        n_sched = args.n_sched
    scale = args.time_scale * (0.3 if args.quick else 1.0)
    config = AdmitConfig(
        runs=args.runs,
        seed=args.seed,
        model=args.model,
        time_scale=scale,
        kernels=args.kernels,
        controllers=args.policy,
        kvs=args.kv,
        hog=args.hog or 0.0,
        hog_procs=args.hog_procs,
    )
    if args.recovery is not None:
        config = replace(config, recovery=args.recovery)
    if args.quick:  # decisions on fewer frames, a pool that fills within the short run
        config = replace(config, pool_sessions=8, admission=replace(config.admission, min_samples=16))
    config = config.sized_for(n_sched)
    total = len(config.kvs) * len(config.controllers) * args.runs * config.horizon
    knee = sc if args.knee_beside and "window" in config.kvs and n_sched >= 1 else None
    with progress_bar(round(total), "bench admit") as bar:
        bar.unit = "s"
        bar.bar_format = "{l_bar}{bar}| {n:.0f}/{total} s [{elapsed}<{remaining}]"  # seconds of runs, whole
        last = [0.0]

        def tick(elapsed: float) -> None:
            step = max(0.0, elapsed - last[0])
            last[0] = elapsed
            bar.update(step)

        def new_run(_: object) -> None:
            last[0] = 0.0

        def knee_read(k: KneeBeside) -> None:
            bar.write(f"knee beside run {k.run}: {k.knee} ({len(k.points)} readings)", file=sys.stderr)

        runs = run_admit(
            config,
            model=model,
            on_round=tick,
            on_run=new_run,
            knee=knee,
            n_sched=n_sched if knee is not None else None,
            on_knee=knee_read,
        )
    report = summarize(config, runs, n_sched, sweep)
    report["plots"] = [str(plot_admit(runs, n_sched, args.out))]
    report["machine"] = {**machine(), "torch_cpu_capability": capability}
    report["seconds"] = round(time.monotonic() - started, 1)
    saved = save_report(report, args.out, "admit")
    if args.json:
        emit_json(report)
        return 0
    rows = []
    for kind in config.kvs:
        for controller, e in report[kind].items():
            rows.append(
                [
                    controller,
                    kind,
                    e["n_star"],
                    n_sched,
                    " ".join(str(r["n_star"]) for r in e["per_run"]),
                    " ".join(str(k) for k in e.get("knee_beside", [])) or "-",
                    e["peak_sessions"],
                    e.get("p99_after_10s_ms_max", "-"),
                    e["collapsed"],
                    e["shed"],
                    e["lost_sessions"],
                ]
            )
    print_table(
        [
            "policy",
            "kv",
            "N*",
            "n_sched",
            "N* per run",
            "knee beside",
            "peak open",
            "p99 >10 s ms (max)",
            "collapsed",
            "shed",
            "lost",
        ],
        rows,
    )
    if sweep is not None:
        print()
        print_table(
            ["N", "p50 ms", "p99 ms", "dropped"],
            [[p["n"], p["p50_ms"], p["p99_ms"], p["dropped"]] for p in sweep["window"]],
        )
    print(f"\nplots: {', '.join(report['plots'])}; report: {saved}  ({report['seconds']} s)")
    return 0


BENCH_ADMIT = Command(
    "bench", "admit", "admission online (model, aimd): converged cap N* beside the sweep's n_sched", _add, _run
)
