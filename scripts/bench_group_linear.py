"""Micro-benchmark: the dense layers read from 4-/8-bit blocks (kernels/groups.cpp) against
torch's float32 ``mm`` on the de-quantized weights, at SmolLM2-135M's shapes, in one run.

    python scripts/bench_group_linear.py [--isa x86-64-v3|x86-64-v4|native] [--threads 1,2]
        [--rows 1,2,4,8,32] [--clock cpu] [--variant NAME=DIR ...]

With ``--isa x86-64-v3`` torch, MKL and oneDNN are held to AVX2 as ``bench step`` holds
them, so both sides are what an AVX2 machine runs. Prints median microseconds per call
and the ratio (groups / mm); below 1 the blocks win. Each layer is held 30 times over
(the model's 30 layers) and a call runs each copy once, so the weights come from memory,
as in a step, not from a cache that one copy fits in. ``--clock cpu`` times the calling
thread's CPU time, not the wall's: with one thread on a machine that other jobs share, the
time the thread waited for a core is then left out (with two, the other thread's is too).
``--variant NAME=DIR`` (repeatable) times the kernels built from the sources in DIR instead
of the worktree's (as scripts/breakdown_step.py builds them), each in turn beside ``mm``,
with the ratio of each to the first variant.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# (name, N, K, kind) of one layer, and the head
SHAPES = [
    ("qkv", 960, 576, "q4_1"),
    ("o_proj", 576, 576, "q4_1"),
    ("gate_up", 3072, 576, "q4_1"),
    ("down", 576, 1536, "q4_1"),
    ("head", 49152, 576, "q8_0"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isa", default="x86-64-v3", choices=["x86-64-v3", "x86-64-v4", "native"])
    parser.add_argument("--threads", default="2,1")
    parser.add_argument("--rows", default="1,2,4,8,16,32")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"])
    parser.add_argument("--variant", action="append", default=[], help="NAME=DIR of kernel sources")
    args = parser.parse_args()
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    from metronome_engine.kernels import held_env  # torch reads its variable at the first op, not on import

    os.environ.update(held_env(args.isa))  # torch, MKL and oneDNN held to the build's vector unit
    import torch

    from metronome_engine.kernels import get_build
    from metronome_engine.quant import QuantBlocks, pack_groups, quantize_weight

    variants: dict[str, Any] = {}
    if args.variant:
        from breakdown_step import build_variant  # scripts/ is on the path when run as a script

        for spec in args.variant:
            name, _, src = spec.partition("=")
            variants[name] = build_variant(name, Path(src), args.isa)
    else:
        get_build(args.isa).load()
        variants["groups"] = get_build(args.isa).ops
    gen = torch.Generator().manual_seed(0)
    layers: dict[str, tuple[list[torch.Tensor], list[torch.Tensor], int]] = {}
    for name, n, k, kind in SHAPES:
        blocks: QuantBlocks = quantize_weight(torch.randn(n, k, generator=gen) * 0.05, kind)  # type: ignore[arg-type]
        copies = 1 if name == "head" else 30
        w, g = blocks.dequantize().t().contiguous(), pack_groups(blocks)
        layers[name] = ([w.clone() for _ in range(copies)], [g.clone() for _ in range(copies)], n)
    results = []
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for rows in [int(r) for r in args.rows.split(",")]:
            for name_, n, k, _ in SHAPES:
                ws, gs, _ = layers[name_]
                x = torch.randn(rows, k, generator=gen)
                ref = x @ ws[0]
                errs = {}
                for name, ops in variants.items():
                    out = ops.group_linear(x, gs[0], n, None)
                    errs[name] = float((out - ref).abs().max() / ref.abs().max())
                times: dict[str, list[float]] = {"mm": [], **{name: [] for name in variants}}
                for _ in range(args.reps):  # interleaved: all see the same machine
                    t = clock()
                    for w in ws:
                        torch.mm(x, w)
                    times["mm"].append((clock() - t) * 1e6 / len(ws))
                    for name, ops in variants.items():
                        t = clock()
                        for g in gs:
                            ops.group_linear(x, g, n, None)
                        times[name].append((clock() - t) * 1e6 / len(gs))
                mm = statistics.median(times["mm"])
                row: dict[str, Any] = {"threads": threads, "rows": rows, "layer": name_, "mm_us": round(mm, 1)}
                line = f"threads {threads} rows {rows:3d} {name_:8s} mm {mm:9.1f} us"
                first = next(iter(variants))
                for name in variants:
                    us = statistics.median(times[name])
                    paired = statistics.median([b / a for a, b in zip(times[first], times[name], strict=True)])
                    row[name] = {"us": round(us, 1), "ratio_mm": round(us / mm, 3), "rel_err": errs[name]}
                    line += f"  {name} {us:9.1f} us ({us / mm:5.3f}x mm, err {errs[name]:.1e})"
                    if name != first:
                        row[name]["paired_ratio"] = round(paired, 3)
                        line += f" {paired:5.3f}x {first}"
                results.append(row)
                print(line, flush=True)
    print(
        json.dumps(
            {
                "isa": args.isa,
                "capability": torch.backends.cpu.get_cpu_capability(),
                "clock": args.clock,
                "loadavg": os.getloadavg(),
                "results": results,
            }
        ),
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
