"""Options the paper's benchmarks (``bench cliff | sweep | admit``) share."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from metronome_engine.cpu import CpuInfo
    from metronome_engine.kernels import Isa

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


def add_isa(p: argparse.ArgumentParser) -> None:
    from metronome_engine.kernels import ISAS

    p.add_argument(
        "--isa",
        choices=ISAS,
        default=os.environ.get("METRONOME_KERNELS_ISA") or "native",
        help="the fused kernels' build: this CPU's own vector unit (default); x86-64-v4 (AVX-512 without "
        "AMX tiles) or x86-64-v3 (AVX2+FMA), each with torch, MKL and oneDNN held to the same vector unit: "
        "such a machine's figures on any x86-64 one that can run them; or generic (no intrinsics: the "
        "paths an aarch64 build runs)",
    )


def select_isa(isa: Isa, cpu: CpuInfo | None = None) -> str:
    """Point this process at the kernels' build ``isa``, and torch's own kernels, MKL and
    oneDNN at its vector unit (``kernels.held_env``: x86-64-v3 holds them to AVX2, x86-64-v4
    to AVX-512 without VNNI or AMX), so that the whole run is what a machine of that kind
    runs; returns torch's CPU capability. ``ValueError`` first where the CPU (default: this
    one) cannot run ``isa``. Call it before anything computes: each library reads its
    variable when first used."""
    from metronome_engine.kernels import HELD_CAPABILITY, ISA_ENV, cannot_run, held_env

    why = cannot_run(isa, cpu)
    if why is not None:  # said here, not as a compiler's failure or a quiet fall back to torch
        raise ValueError(f"--isa {isa}: {why}")
    os.environ[ISA_ENV] = isa
    held = held_env(isa)
    os.environ.update(held)
    capability = str(torch.backends.cpu.get_cpu_capability())
    if isa in HELD_CAPABILITY and capability not in (HELD_CAPABILITY[isa], "DEFAULT"):
        raise RuntimeError(
            f"torch already chose its {capability} kernels in this process; run with "
            + " ".join(f"{k}={v}" for k, v in held.items())
        )
    return capability


def setup_threads(args: argparse.Namespace) -> None:
    """Set torch's threads."""
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
