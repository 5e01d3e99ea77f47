"""The stages of ``scripts/gpu_check.sh``, one per call: ``python scripts/gpu_check.py STAGE --out DIR``.

Untested: no GPU has run this file. Each stage writes ``DIR/STAGE.json`` (every figure it
measured) and exits non-zero when its check fails; the shell script times each stage, records
its exit status and goes on to the next.

- ``imports``: torch, vLLM and CUDA; the plugin registers; ``select_backend`` gives the
  FlashAttention backend for bf16 and refuses float32 and an fp8 cache.
- ``forward``: ``SinkWindowFlashImpl.forward`` with the real kernels against the dense float32
  reference of ``tests/vllm/test_attention.py`` on a paged bf16 cache whose free and freed
  blocks hold junk, under ``torch.cuda.set_sync_debug_mode("error")``; then one CUDA graph
  capture and replay of the same forward.
- ``e2e``: a tiny random Llama end to end, greedy tokens per position: the windowed backend
  eager and compiled with CUDA graphs against the float32 torch runner, beside the full
  policy's bf16/fp32 agreement (vLLM's own attention in bf16 against the torch runner), the
  yardstick of what bf16 alone changes.
- ``scale``: a Llama-3.2-1B-shaped model (``--size 8b``: Llama-3.1-8B, the second run) with
  dummy weights, 200 sessions appending 4-token frames: one vLLM forward a tick, used blocks
  within sessions x bound, no preemption, per-tick wall time and GPU busy time (profiler).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the tests' helpers (dense reference, tiny model) are the yardsticks

LLAMA = {
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "head_dim": 64},
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "head_dim": 128},
}


# the e2e steps are a few dozen tokens: graphs up to 128 keep the capture inside the stage's budget
SMALL_GRAPHS = {"compilation_config": {"cudagraph_mode": "PIECEWISE", "max_cudagraph_capture_size": 128}}


def stage_imports(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import vllm
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from metronome_engine.vllm_backend.attn_backend import FLASH_BACKEND_NAME
    from metronome_engine.vllm_backend.plugin import register
    from metronome_engine.vllm_backend.selector import select_backend

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this check is for GPU machines (on CPU run `make test-vllm`)")
    register()
    backend = select_backend(64, torch.bfloat16, "auto")
    refused: dict[str, bool] = {}
    checks: tuple[tuple[str, Callable[[], object]], ...] = (
        ("float32", lambda: select_backend(64, torch.float32, "auto")),
        ("fp8", lambda: select_backend(64, torch.bfloat16, "fp8")),
    )
    for name, call in checks:
        try:
            call()
            refused[name] = False
        except ValueError:
            refused[name] = True
    from vllm.v1.attention.backends import fa_utils

    return {
        "ok": backend.get_name() == FLASH_BACKEND_NAME and all(refused.values()),
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "registered": FLASH_BACKEND_NAME in AttentionBackendEnum.__members__,
        "backend": backend.get_name(),
        "refused": refused,
        "flash_attn_version": fa_utils.get_flash_attn_version(),
    }


def stage_forward(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from tests.vllm.test_attention import HEAD, HEADS, KV_HEADS, LAYOUTS, make_step
    from tests.vllm.test_flash_path import dense_want, packed_query, step_metadata

    from metronome_engine.vllm_backend.attention import write_kv
    from metronome_engine.vllm_backend.attn_backend import SinkWindowFlashBackend

    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    layer = SimpleNamespace(_k_scale=torch.ones(1, device=cuda), _v_scale=torch.ones(1, device=cuda))
    rows: list[dict[str, Any]] = []
    tolerance = 5e-2  # bf16 cache and query against a float32 reference from the unrounded values
    for layout in LAYOUTS:
        for window, sinks in ((24, 4), (40, 4), (24, 0)):
            step = make_step(window + sinks, window=window, sinks=sinks, block_size=16, layout=LAYOUTS[layout])
            want = dense_want(step, window=window, sinks=sinks)
            query = packed_query(step, window=window, sinks=sinks).to(cuda, bf16)
            dev: dict[str, Any] = {k: v.to(cuda) if isinstance(v, torch.Tensor) else v for k, v in step.items()}
            cache = step["cache"]
            assert isinstance(cache, torch.Tensor)
            dev["cache"] = cache.to(cuda, bf16)  # keeps the layout's strides
            write_kv(dev["cache"], dev["k_new"], dev["v_new"], dev["slots"])
            md = step_metadata(dev, window=window, sinks=sinks, block_size=16)
            impl = SinkWindowFlashBackend().get_impl_cls()(
                HEADS, HEAD, 1.0 / math.sqrt(HEAD), KV_HEADS, None, window, "auto", sink_tokens=sinks
            )
            output = torch.empty(query.shape[0], HEADS, HEAD, device=cuda, dtype=bf16)
            row: dict[str, Any] = {"layout": layout, "window": window, "sinks": sinks}
            torch.cuda.set_sync_debug_mode("error")
            try:
                impl.forward(layer, query, None, None, dev["cache"], md, output)
                row["host_syncs"] = "none"
            except RuntimeError as exc:  # a host sync inside forward: record it, then take the numbers anyway
                row["host_syncs"] = repr(exc)
            finally:
                torch.cuda.set_sync_debug_mode(0)
            if row["host_syncs"] != "none":
                impl.forward(layer, query, None, None, dev["cache"], md, output)
            row["max_abs_err"] = float((output.float().cpu() - want).abs().max())
            # one capture and replay: the same forward inside a CUDA graph
            graph_out = torch.zeros_like(output)
            side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                impl.forward(layer, query, None, None, dev["cache"], md, graph_out)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                impl.forward(layer, query, None, None, dev["cache"], md, graph_out)
            graph_out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            row["graph_max_abs_err"] = float((graph_out.float().cpu() - want).abs().max())
            row["ok"] = (
                row["host_syncs"] == "none" and row["max_abs_err"] < tolerance and row["graph_max_abs_err"] < tolerance
            )
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"ok": all(r["ok"] for r in rows), "tolerance": tolerance, "rows": rows}


def _agreement(got: list[list[int | None]], want: list[list[int | None]]) -> float:
    pairs = [(a, b) for g, w in zip(got, want, strict=True) for a, b in zip(g, w, strict=True)]
    return sum(a == b for a, b in pairs) / len(pairs)


def stage_e2e(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    from tests.vllm.conftest import tiny_llama_dir
    from tests.vllm.test_agreement import chunks, greedy

    from metronome_engine import EngineCore, KVPolicy
    from metronome_engine.vllm_backend import VLLMEngineCore
    from metronome_engine.weights import load_model

    model = tiny_llama_dir(out / "tiny-llama")
    window = KVPolicy.windowed(64, sinks=4)
    sessions = [chunks(4, 80), chunks(5, 70, first=3)]  # 150+ tokens: the window has moved on
    refs = {
        name: greedy(EngineCore(load_model(model), policy=p, num_blocks=256, block_size=32, kernels="torch"), sessions)
        for name, p in (("window", window), ("full", KVPolicy.full()))
    }
    runs: dict[str, tuple[str, dict[str, Any]]] = {
        "window bf16 eager": ("window", {"policy": window, "enforce_eager": True}),
        "window bf16 graphs": ("window", {"policy": window, "enforce_eager": False, "engine_args": SMALL_GRAPHS}),
        "full bf16 eager": ("full", {"policy": KVPolicy.full(), "enforce_eager": True}),
    }
    result: dict[str, Any] = {"window_vs_full_torch": _agreement(refs["window"], refs["full"])}
    for name, (ref, kwargs) in runs.items():
        started = time.perf_counter()
        with VLLMEngineCore(model, num_blocks=64, block_size=32, **kwargs) as core:
            result[f"{name} start_s"] = time.perf_counter() - started
            result[name] = _agreement(greedy(core, sessions), refs[ref])
        print(name, result[name], flush=True)
    yardstick = result["full bf16 eager"]
    result["yardstick"] = "full bf16 eager: what bf16 alone changes against the float32 torch runner"
    result["ok"] = all(result[n] >= yardstick - 0.1 for n in runs)
    return result


def stage_scale(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from metronome_engine import KVPolicy, StepRequest
    from metronome_engine.vllm_backend import VLLMEngineCore

    shape = LLAMA[args.size]
    folder = out / f"llama-{args.size}"
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 128256,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": args.size == "1b",
        "torch_dtype": "bfloat16",
        **shape,
    }
    (folder / "config.json").write_text(json.dumps(config))
    sessions, frame, prompt, ticks, block_size = 200, 4, 256, 30, 16
    policy = KVPolicy.windowed(256, sinks=4)
    bound = policy.max_blocks(block_size, chunk=frame)
    assert bound is not None
    started = time.perf_counter()
    core = VLLMEngineCore(
        folder,
        policy=policy,
        num_blocks=sessions * bound + 64,
        block_size=block_size,
        load_format="dummy",
        max_sessions=sessions,
        tick_tokens=frame,
        max_num_batched_tokens=8192,  # the prompts in a few forwards; a frame tick is 800 tokens
        # the tick's size captured (the prompts run eagerly): capturing every size to 2048 would not fit the budget
        engine_args={"compilation_config": {"cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [8, 800]}},
    )
    result: dict[str, Any] = {"size": args.size, "start_s": time.perf_counter() - started, "bound_blocks": bound}
    with core:
        ids = [core.add_sequence() for _ in range(sessions)]
        g = torch.Generator().manual_seed(0)

        def tokens(n: int) -> list[int]:
            return torch.randint(0, 128000, (n,), generator=g).tolist()

        core.step([StepRequest(i, tokens(prompt)) for i in ids])
        walls, forwards, used, stalls = [], [], [], 0

        def tick() -> None:
            nonlocal stalls
            before = core.vllm_stats().forward_passes
            t0 = time.perf_counter()
            outs = core.step([StepRequest(i, tokens(frame)) for i in ids])
            walls.append(time.perf_counter() - t0)
            forwards.append(core.vllm_stats().forward_passes - before)
            used.append(core.pool_stats().used_blocks)
            stalls += sum(not o.ok for o in outs)

        for _ in range(ticks):
            tick()
        gpu_ms = _profiled_gpu_ms(tick, 3)
        stats = core.vllm_stats()
    result.update(
        {
            "ticks": ticks,
            "tick_ms_p50": 1e3 * statistics.median(walls),
            "tick_ms_max": 1e3 * max(walls),
            "gpu_busy_ms_per_tick": gpu_ms,
            "host_ms_per_tick": None if gpu_ms is None else 1e3 * statistics.median(walls[-3:]) - gpu_ms,
            "forwards_per_tick": sorted(set(forwards)),
            "used_blocks_max": max(used),
            "used_blocks_limit": sessions * bound,
            "preemptions": stats.num_preemptions,
            "stalls": stalls,
        }
    )
    result["ok"] = set(forwards) == {1} and max(used) <= sessions * bound and stats.num_preemptions == 0 and stalls == 0
    return result


def _profiled_gpu_ms(tick: Callable[[], None], n: int) -> float | None:
    """GPU busy time per tick: the summed device time of every kernel over ``n`` profiled ticks."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                tick()
            torch.cuda.synchronize()
        total_us = sum(e.self_device_time_total for e in prof.key_averages())
    except Exception as exc:  # the figure is extra: report it missing, not the stage failed
        print(f"profiler: {exc!r}", flush=True)
        return None
    return float(total_us) / 1e3 / n


STAGES = {"imports": stage_imports, "forward": stage_forward, "e2e": stage_e2e, "scale": stage_scale}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=list(STAGES))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", choices=list(LLAMA), default="1b", help="the scale stage's model shape")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result = STAGES[args.stage](args.out, args)
    (args.out / f"{args.stage}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"stage": args.stage, "ok": result["ok"]}), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
