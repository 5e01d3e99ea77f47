"""Options the paper's benchmarks (``bench cliff | sweep | admit``) share."""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

from .._extras import require

__all__ = ["add_common", "add_isa", "machine", "positive_float", "save_report", "select_isa", "setup_threads"]


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


# what `--isa x86-64-v3` tells this process's libraries, so that the whole run (the fused
# kernels, torch's own kernels, MKL and oneDNN under the torch path and HF) is what an AVX2
# machine runs. Each library reads its variable when first used, which is after this is set.
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def add_isa(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--isa",
        choices=["native", "x86-64-v3", "generic"],
        default=os.environ.get("METRONOME_KERNELS_ISA") or "native",
        help="the fused kernels' build: this CPU's own vector unit (default), x86-64-v3 (AVX2+FMA, with "
        "torch, MKL and oneDNN held to AVX2 too): an AVX2 machine's figures on any x86-64 one, or generic "
        "(no intrinsics: the paths an aarch64 build runs)",
    )


def select_isa(isa: str) -> str:
    """Point this process at the kernels' build ``isa``; returns torch's CPU capability. Call it before
    anything computes."""
    from metronome_engine.kernels import ISA_ENV, cannot_run

    why = cannot_run(isa)  # type: ignore[arg-type]  # argparse's choices are the builds
    if why is not None:  # said here, not as a compiler's failure or a quiet fall back to torch
        raise ValueError(f"--isa {isa}: {why}")
    os.environ[ISA_ENV] = isa
    if isa == "x86-64-v3":
        os.environ.update(AVX2_ENV)
    capability = str(torch.backends.cpu.get_cpu_capability())
    if isa == "x86-64-v3" and capability not in ("AVX2", "DEFAULT"):
        raise RuntimeError(
            f"torch already chose its {capability} kernels in this process; run with "
            + " ".join(f"{k}={v}" for k, v in AVX2_ENV.items())
        )
    return capability


def setup_threads(args: argparse.Namespace) -> None:
    """Set torch's threads, and check the plots' extra before a long run rather than after it."""
    require("matplotlib", extra="bench", feature="metronome bench (its plots)")
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)


def machine() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_avg_1m": None if load is None else round(load[0], 2),
    }


def save_report(report: dict[str, Any], out: Path, name: str) -> Path:
    """The JSON report beside the plots, whether or not ``--json`` printed it."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return path
