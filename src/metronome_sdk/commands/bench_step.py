"""``metronome bench step``: decode-step latency vs batch, beside HF transformers and the floor."""

from __future__ import annotations

import argparse
import platform
import sys

import torch

from ._base import Command, emit_json, print_table


def _batches(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--batch takes comma-separated ints, got {text!r}") from None
    if not values or any(v < 1 or v > 1024 for v in values):
        raise argparse.ArgumentTypeError(f"--batch sizes must be in [1, 1024], got {text!r}")
    return values


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=_batches, default=[1, 8, 32], help="batch sizes (default 1,8,32)")
    p.add_argument("--steps", type=int, default=10, help="timed decode steps per measurement (median)")
    p.add_argument("--no-hf", action="store_true", help="skip the HF transformers baseline")
    p.add_argument("--model", default="smollm2-135m-instruct", help="known model name, HF folder or .gguf file")
    p.add_argument(
        "--quantize", choices=["q8_0", "q4_1"], default=None, help="quantize --model's weights on load (cached)"
    )
    p.add_argument("--baseline", default=None, help="also time the engine on this model, in turn (e.g. a GGUF)")
    p.add_argument(
        "--kernels",
        choices=["auto", "fused", "torch"],
        default="auto",
        help="the engine's CPU path: fused kernels, plain torch ops, or fused where they build (default)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def _run(args: argparse.Namespace) -> int:
    from ..bench.step import run_step_bench

    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")

    def say(msg: str) -> None:
        print(f"[bench step] {msg}", file=sys.stderr, flush=True)

    roof, results, kernels, layout = run_step_bench(
        args.batch,
        model=args.model,
        steps=args.steps,
        with_hf=not args.no_hf,
        kernels=args.kernels,
        on_progress=say,
        quantize=args.quantize,
        baseline=args.baseline,
    )
    batches = [r.as_dict() for r in results]
    report = {
        "batches": batches,
        "kernels": kernels,
        "weights": layout,
        "model": args.model,
        "quantize": args.quantize,
        "baseline": args.baseline,
        "gemm_gflops": roof.gemm_gflops,
        "copy_gbs": roof.copy_gbs,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
    }
    if args.json:
        emit_json(report)
    else:
        print(
            f"peak roofline: fp32 GEMM {roof.gemm_gflops:.1f} GFLOP/s, copy {roof.copy_gbs:.1f} GB/s "
            f"({torch.get_num_threads()} threads); engine kernels: {kernels}, weights: {layout}"
        )
        base = ["baseline ms", "engine/baseline"] if args.baseline else []
        print_table(
            [
                "batch",
                "context",
                "engine ms",
                "HF ms",
                "floor ms",
                "peak floor ms",
                "engine/HF",
                "engine/floor",
                "engine/peak",
                *base,
            ],
            [
                [
                    b["batch"],
                    f"{b['context_min']}-{b['context_max']}",
                    b["engine_ms"],
                    b["hf_ms"],
                    b["floor_ms"],
                    b["floor_peak_ms"],
                    b["engine_vs_hf"],
                    b["engine_vs_floor"],
                    b["engine_vs_floor_peak"],
                    *([b["baseline_ms"], b["engine_vs_baseline"]] if args.baseline else []),
                ]
                for b in batches
            ],
        )
        print("floor: the roofline measured in turn with the steps (median); peak floor: its best, measured before")
        if args.baseline:
            print(f"baseline: the engine on {args.baseline}, its steps in turn with the engine's")
    return 0


BENCH_STEP = Command("bench", "step", "engine decode-step latency vs batch, beside HF transformers", _add, _run)
