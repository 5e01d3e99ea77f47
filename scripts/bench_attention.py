"""Micro-benchmark: paged attention of one decode step (kernels/ops.cpp ``paged_attention``)
at SmolLM2-135M's shapes (9 query heads, 3 kv heads, head_dim 64), B sessions at contexts
spread over [lo, hi), its K/V from memory as in a step (one pool per layer, 30 layers), for
one or more builds of the kernels' sources timed in turn (see breakdown_step.py).

    python scripts/bench_attention.py [--isa x86-64-v3|native] [--batch 32] [--threads 1,2]
        [--variant NAME=DIR ...] [--clock wall|cpu]

Prints per variant the median ms of the 30 layers' attention, the GB/s of K/V it reads, and
beside them the time torch takes to read the same bytes once (a sum over each layer's
resident blocks: the memory floor, measured in turn); and the largest difference from the
first variant's output (bits may differ only by the order of sums).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from breakdown_step import _AVX2_ENV, build_variant


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isa", default="x86-64-v3", choices=["x86-64-v3", "native"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--variant", action="append", default=[], help="NAME=DIR of kernel sources")
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--calls", type=int, default=1, help="steps per timing (a few layers' K/V stay in cache)")
    parser.add_argument("--context-lo", type=int, default=128)
    parser.add_argument("--context-hi", type=int, default=272)
    parser.add_argument(
        "--blocks",
        default="scattered",
        choices=["scattered", "engine"],
        help="blocks anywhere in the pool, or each session's in a run (as an engine's pool hands them out in order)",
    )
    args = parser.parse_args()
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    if args.isa == "x86-64-v3":
        os.environ.update(_AVX2_ENV)
    import torch

    if not args.variant:
        here = Path(__file__).resolve().parents[1] / "engine_backend" / "metronome_engine" / "kernels"
        args.variant = [f"tree={here}"]
    variants = {}
    for spec in args.variant:
        name, _, src = spec.partition("=")
        variants[name] = build_variant(name, Path(src), args.isa)
    B, H, KVH, HD, BS = args.batch, 9, 3, 64, 16
    lo, hi = args.context_lo, args.context_hi
    contexts = [lo + (i * (hi - lo)) // B for i in range(B)]
    counts = [-(-c // BS) for c in contexts]
    max_blocks = max(counts)
    num_blocks = sum(counts) + 8
    gen = torch.Generator().manual_seed(0)
    # blocks scattered over the pool, as sessions leave them, or in the pool's order
    perm = torch.randperm(num_blocks, generator=gen) if args.blocks == "scattered" else torch.arange(num_blocks)
    physical = torch.zeros(B, max_blocks, dtype=torch.int64)
    logical = torch.zeros(B, max_blocks, dtype=torch.int64)
    at = 0
    for b, n in enumerate(counts):
        physical[b, :n] = perm[at : at + n]
        logical[b, :n] = torch.arange(n)
        at += n
    count = torch.tensor(counts, dtype=torch.int64)
    positions = torch.tensor([c - 1 for c in contexts], dtype=torch.int64)
    query_start = torch.arange(B + 1, dtype=torch.int64)
    kc = [torch.randn(KVH, num_blocks * BS, HD, generator=gen) for _ in range(args.layers)]
    vc = [torch.randn(KVH, num_blocks * BS, HD, generator=gen) for _ in range(args.layers)]
    q = torch.randn(B, H, HD, generator=gen)
    scale = HD**-0.5
    idx = torch.cat([torch.arange(p * BS, (p + 1) * BS) for b in range(B) for p in physical[b, : counts[b]].tolist()])
    kv_bytes = 2 * args.layers * KVH * idx.numel() * HD * 4

    def attend(ops: object) -> torch.Tensor:
        out = None
        for layer in range(args.layers):
            out = ops.paged_attention(  # type: ignore[attr-defined]
                q, None, kc[layer], vc[layer], query_start, positions, logical, physical, count, BS, 0, 0, scale
            )
        assert out is not None
        return out

    def read_floor() -> None:
        for layer in range(args.layers):
            kc[layer].sum()
            vc[layer].sum()

    first = next(iter(variants))
    ref = attend(variants[first])
    for name, ops in variants.items():
        diff = float((attend(ops) - ref).abs().max())
        print(f"{name}: max |out - {first}'s| = {diff:.2e}")
    pool_bytes = 2 * args.layers * kc[0].numel() * 4
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        times: dict[str, list[float]] = {n: [] for n in [*variants, "read"]}
        for _ in range(args.reps):
            for name, ops in variants.items():
                t = clock()
                for _ in range(args.calls):
                    attend(ops)
                times[name].append((clock() - t) * 1e3 / args.calls)
            t = clock()
            read_floor()
            times["read"].append((clock() - t) * 1e3)
        read_ms = statistics.median(times["read"])
        print(
            f"{args.isa} threads {threads}: pool read (torch sum, {pool_bytes / 1e6:.0f} MB) {read_ms:.2f} ms "
            f"= {pool_bytes / read_ms / 1e6:.1f} GB/s; K/V the queries see {kv_bytes / 1e6:.0f} MB"
        )
        for name in variants:
            ms = statistics.median(times[name])
            base = statistics.median(times[first])
            paired = statistics.median(y / x for x, y in zip(times[first], times[name], strict=True))
            print(
                f"  {name}: {ms:.3f} ms ({kv_bytes / ms / 1e6:.1f} GB/s of K/V), {ms / base:.3f}x {first} "
                f"(median of paired ratios {paired:.3f})",
                flush=True,
            )


if __name__ == "__main__":
    main()
