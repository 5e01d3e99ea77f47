"""Options the paper's benchmarks (``bench cliff | sweep | admit``) share."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch

from .._extras import require

__all__ = ["add_common", "machine", "positive_float", "save_report", "setup_threads"]


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--time-scale",
        type=positive_float,
        default=1.0,
        help="stretch (>1) or shrink (<1) the experiment's timeline (default 1)",
    )
    p.add_argument("--quick", action="store_true", help="a small run for smoke tests (under a minute)")
    p.add_argument("--seed", type=int, default=0, help="seed of arrivals and durations (default 0)")
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for the PNG plots (default bench-out/)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a shared CPU, spinning intra-op threads slow every step)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def setup_threads(args: argparse.Namespace) -> None:
    """Set torch's threads, and check the plots' extra before a long run rather than after it."""
    require("matplotlib", extra="bench", feature="metronome bench (its plots)")
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)


def machine() -> dict[str, Any]:
    """What every benchmark's JSON says of the machine: ``lscpu``'s model name, the vector
    flags that pick a kernel path, the kernels' build this process runs, torch's threads and
    CPU capability, and the load when it was written."""
    from metronome_engine import cpu
    from metronome_engine.kernels import default_isa

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        **cpu.describe(),
        "build": default_isa(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "torch_cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
        "load_avg_1m": None if load is None else round(load[0], 2),
    }


def save_report(report: dict[str, Any], out: Path, name: str) -> Path:
    """The JSON report beside the plots, whether or not ``--json`` printed it."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return path
