"""Where a decode step's time goes: one step of B sessions (SmolLM2-135M, real weights, the
fused kernels with the dense layers on column groups) split into its parts, per thread count,
for one or more builds of the kernels' sources timed in turn (A/B).

    python scripts/breakdown_step.py [--isa x86-64-v3|x86-64-v4|native] [--batch 32] [--threads 1,2]
        [--variant NAME=DIR ...] [--steps 10] [--clock wall|cpu]

Each variant is the kernels' sources in DIR (ops.cpp, groups.cpp, tiles.cpp and headers),
built here under its own op namespace (``metronome_b_NAME``), so several builds load in one
process and their steps alternate: the load of a shared machine drifts over seconds, and
ratios of steps taken in turn see the same drift. Without ``--variant`` the worktree's
sources run alone. ``--clock cpu`` times the calling thread's CPU time: with one thread on a
shared machine, the time it waited for a core is left out (with two, so is the other thread).

Per variant and thread count it prints the median of: the whole step (``engine.step``, as
``bench step`` times it); the decoder layers' one call; the head (the 8-bit output layer);
the final norm and the greedy pass over the logits; and a second, split run where each
layer's kernels are called one by one from Python and timed apiece: the dense layers (qkv,
o_proj, gate_up, down_proj), attention, rope_store, the norms and silu_mul. "python" is the
whole step less the layers' call, the head, the final norm and the greedy pass: the
engine's own Python.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

_clock = time.perf_counter


def build_variant(name: str, src: Path, isa: str) -> Any:
    """Build the kernels' sources in ``src`` under the namespace ``metronome_b_<name>``."""
    import torch
    from torch.utils import cpp_extension

    from metronome_engine.kernels import _put_ninja_on_path, get_build

    ns = f"metronome_b_{name}"
    # the engine's own flags for this build, under the variant's namespace
    flags = [f for f in get_build(isa).cflags() if not f.startswith("-DMETRONOME_OPS=")]
    flags.append(f"-DMETRONOME_OPS={ns}")
    key = hashlib.sha256(" ".join(flags).encode() + torch.__version__.encode())
    for f in sorted(src.iterdir()):
        if f.suffix in (".cpp", ".h"):
            key.update(f.read_bytes())
    target = Path(os.environ.get("TMPDIR", "/tmp")) / "metronome-variants" / key.hexdigest()[:16]
    target.mkdir(parents=True, exist_ok=True)
    _put_ninja_on_path()
    cpp_extension.load(
        name=f"{ns}_kernels",
        # every .cpp in DIR: the build's files change (chunk_attention.cpp came after this script)
        sources=[str(f) for f in sorted(src.glob("*.cpp"))],
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"],
        build_directory=str(target),
        is_python_module=False,
        verbose=False,
    )
    return getattr(torch.ops, ns)


class TimedOps:
    """An op namespace whose calls are timed by part; with ``split``, ``decoder_layers`` runs
    as its kernels called one by one (as ops.cpp's loop calls them) so each part is timed."""

    def __init__(self, ops: Any, split: bool) -> None:
        self.ops, self.split = ops, split
        self.times: dict[str, float] = defaultdict(float)

    def _timed(self, label: str, fn: Callable[..., Any], *args: Any) -> Any:
        t = _clock()
        out = fn(*args)
        self.times[label] += _clock() - t
        return out

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.ops, name)
        if name == "decoder_layers" and self.split:
            return self._layers
        if name == "linear":
            return lambda x, w, *rest: self._timed(_linear_label(x, rest[2]), fn, x, w, *rest)
        label = {"rms_norm": "final_norm", "decoder_layers": "layers"}.get(name, name)
        return lambda *args: self._timed(label, fn, *args)

    def _layers(self, x: Any, weights: Any, k_cache: Any, v_cache: Any, cos: Any, sin: Any, *rest: Any) -> Any:
        import math

        sink_cos, sink_sin, slots, qs, pos, bl, bp, bc, bs, window, sinks, heads, inter, eps, pinned = rest
        ops, t = self.ops, self._timed
        hidden, hd = x.size(1), k_cache.size(3)
        width = (heads + 2 * k_cache.size(1)) * hd
        scale = 1.0 / math.sqrt(hd)
        for i in range(k_cache.size(0)):
            w = weights[14 * i : 14 * i + 14]
            kc, vc = k_cache[i], v_cache[i]
            h = t("norms", ops.rms_norm, x, w[0], eps)
            qkv = t("qkv", ops.linear, h, w[1], w[2], w[3], width, None)
            q, q_sink = t("rope_store", ops.rope_store, qkv, cos, sin, sink_cos, sink_sin, slots, kc, vc, heads)
            args = (q, q_sink if sink_cos is not None else None, kc, vc, qs, pos, bl, bp, bc, bs, window, sinks)
            attn = t("attention", ops.paged_attention, *args, scale, pinned)
            x = t("o_proj", ops.linear, attn, w[4], w[5], w[6], hidden, x)
            h = t("norms", ops.rms_norm, x, w[7], eps)
            gu = t("gate_up", ops.linear, h, w[8], w[9], w[10], 2 * inter, None)
            act = t("silu_mul", ops.silu_mul, gu)
            x = t("down_proj", ops.linear, act, w[11], w[12], w[13], hidden, x)
        return x


def _linear_label(x: Any, n: int) -> str:
    return "head" if n > 10000 else f"linear_{n}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isa", default="x86-64-v3", choices=["x86-64-v3", "x86-64-v4", "native"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--variant", action="append", default=[], help="NAME=DIR of kernel sources")
    parser.add_argument("--context-lo", type=int, default=128)
    parser.add_argument("--context-hi", type=int, default=272)
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"])
    args = parser.parse_args()
    global _clock
    _clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    from metronome_engine.kernels import held_env  # torch reads its variable at the first op, not on import

    os.environ.update(held_env(args.isa))  # torch, MKL and oneDNN held to the build's vector unit
    os.environ["METRONOME_KERNELS_ISA"] = args.isa
    import torch

    from metronome_engine import EngineCore, KVPolicy, StepRequest
    from metronome_engine.kernels.choice import REGIMES
    from metronome_engine.weights import load_model

    model = load_model("smollm2-135m-instruct")
    variants: dict[str, Any] = {}
    if not args.variant:
        here = Path(__file__).resolve().parents[1] / "engine_backend" / "metronome_engine" / "kernels"
        args.variant = [f"tree={here}"]
    for spec in args.variant:
        name, _, src = spec.partition("=")
        variants[name] = build_variant(name, Path(src), args.isa)
    lo, hi, batch = args.context_lo, args.context_hi, args.batch
    contexts = [lo + (i * (hi - lo)) // batch for i in range(batch)]
    engines: dict[str, tuple[Any, list[int], dict[int, int]]] = {}
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, model.config.vocab_size, (c,), generator=gen).tolist() for c in contexts]
    rounds = 3 * args.steps + 4  # steps per variant and thread count, each growing every context by one
    for name, ops in variants.items():
        need = sum(-(-(c + rounds * 2 + 3) // 16) for c in contexts) + batch
        engine = EngineCore(model, policy=KVPolicy.full(), num_blocks=need, block_size=16, kernels="fused")
        engine.pin_paths(dict.fromkeys(REGIMES, "groups"))
        engine.ops = ops
        seqs = []
        for p in prompts:
            seq = engine.add_sequence()
            engine.step([StepRequest(seq, p, sample=False)])
            seqs.append(seq)
        engines[name] = (engine, seqs, dict.fromkeys(seqs, 1))

    def step(name: str, timed: TimedOps | None) -> float:
        engine, seqs, nxt = engines[name]
        raw = engine.ops
        if timed is not None:
            engine.ops = timed
        t = _clock()
        try:
            outs = engine.step([StepRequest(s, [nxt[s]]) for s in seqs])
        finally:
            engine.ops = raw
        ms = (_clock() - t) * 1e3
        for o in outs:
            assert o.token is not None
            nxt[o.seq_id] = o.token
        return ms

    report: list[dict[str, Any]] = []
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        samples: dict[str, dict[str, list[float]]] = {n: defaultdict(list) for n in variants}
        for name in variants:  # warm-up
            step(name, None)
        for _ in range(args.steps):
            for name, ops in variants.items():  # in turn: the same load for every variant
                samples[name]["step"].append(step(name, None))
                coarse = TimedOps(ops, split=False)
                whole = step(name, coarse)
                parts = {k: v * 1e3 for k, v in coarse.times.items()}
                samples[name]["layers_call"].append(parts.get("layers", 0.0))
                samples[name]["head"].append(parts.get("head", 0.0))
                samples[name]["final_norm"].append(parts.get("final_norm", 0.0))
                samples[name]["greedy"].append(parts.get("greedy_rows", 0.0))
                samples[name]["python"].append(whole - sum(parts.values()))
                fine = TimedOps(ops, split=True)
                step(name, fine)
                for k, v in fine.times.items():
                    if k not in ("head", "final_norm", "greedy_rows"):
                        samples[name][k].append(v * 1e3)
        for name in variants:
            med = {k: statistics.median(v) for k, v in samples[name].items()}
            row = {"variant": name, "threads": threads, "batch": batch, **{k: round(v, 2) for k, v in med.items()}}
            report.append(row)
            parts = ", ".join(f"{k} {v:.2f}" for k, v in med.items())
            print(f"{args.isa} threads {threads} {name}: {parts}", flush=True)
        if len(variants) > 1:
            first = next(iter(variants))
            for name in list(variants)[1:]:
                a, b = samples[first]["step"], samples[name]["step"]
                ratios = [y / x for x, y in zip(a, b, strict=True)]
                print(f"  step {name}/{first}: median of paired ratios {statistics.median(ratios):.3f}", flush=True)
    meta = {"isa": args.isa, "clock": args.clock, "contexts": [lo, hi], "loadavg": os.getloadavg()}
    print(json.dumps({**meta, "rows": report}), file=sys.stderr)


if __name__ == "__main__":
    main()
