"""``metronome bench sweep``: per-frame latency p50/p99 against N, both KV policies."""

from __future__ import annotations

import argparse
import time

from metronome_sdk.cli import Command

from ._common import add_common, machine, save_report, setup_threads
from ._output import emit_json, print_table, progress_bar


def _ns(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ns takes comma-separated ints, got {text!r}") from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"--ns must be session counts >= 1, got {text!r}")
    return values


def add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ns", type=_ns, default=None, help="session counts (default 1,2,4,6,8,10,12,14,16)")
    p.add_argument("--model", default="smollm2-135m-instruct", help="model name or folder (default SmolLM2)")
    p.add_argument(
        "--kernels",
        choices=("auto", "fused", "torch"),
        default="auto",
        help="the engine's CPU path (default auto); --kernels torch stands for a slower machine",
    )


def sweep_config(args: argparse.Namespace, policies: tuple[str, ...] = ("window", "full")) -> object:
    from ..sweep import SweepConfig

    kwargs: dict[str, object] = {
        "model": args.model,
        "time_scale": args.time_scale,
        "policies": policies,
        "kernels": args.kernels,
    }
    if args.ns is not None:
        kwargs["ns"] = args.ns
    if args.quick:
        kwargs.setdefault("ns", (1, 4, 8))
        kwargs["ticks"], kwargs["warmup_ticks"] = (8, 3) if policies == ("window", "full") else (6, 2)
    return SweepConfig(**kwargs)  # type: ignore[arg-type]


def _add(p: argparse.ArgumentParser) -> None:
    add_sweep_arguments(p)
    add_common(p)


def _run(args: argparse.Namespace) -> int:
    from ..plots import plot_sweep
    from ..sweep import SweepConfig, run_sweep, summarize

    setup_threads(args)
    config = sweep_config(args)
    assert isinstance(config, SweepConfig)
    started = time.monotonic()
    total = len(config.ns) * len(config.policies) * (config.warmup_ticks + config.measured_ticks + 1)
    with progress_bar(total, "bench sweep") as bar:
        bar.unit = "tick"
        points = run_sweep(config, on_round=lambda: bar.update(1))
    report = summarize(config, points)
    report["plots"] = [str(plot_sweep(points, report["deadline_ms"], report["n_sched"], args.out))]
    report["machine"] = machine()
    report["seconds"] = round(time.monotonic() - started, 1)
    saved = save_report(report, args.out, "sweep")
    if args.json:
        emit_json(report)
        return 0
    print_table(
        [
            "policy",
            "N",
            "p50 ms",
            "p99 ms",
            "frames",
            "answered",
            "stalled",
            "errors",
            "dropped",
            "step ms",
            "stall at s",
        ],
        [
            [
                kind,
                p["n"],
                p["p50_ms"],
                p["p99_ms"],
                p["frames"],
                p["answered"],
                p["stalled"],
                p["errors"],
                p["dropped"],
                p["step_ms"],
                p["stalled_at_s"],
            ]
            for kind in config.policies
            for p in report[kind]
        ],
    )
    print(
        f"\ndeadline {report['deadline_ms']:.0f} ms: n_sched (kv=window) = {report['n_sched']}, "
        f"kv=full = {report['n_sched_full']}"
    )
    print(f"plots: {', '.join(report['plots'])}; report: {saved}  ({report['seconds']} s)")
    return 0


BENCH_SWEEP = Command(
    "bench", "sweep", "per-frame latency p50/p99 against concurrent sessions, both KV policies", _add, _run
)
