"""Per-tick time of the vLLM backend: window + sinks against vLLM's own attention, same run.

``python -m metronome_engine.vllm_backend.bench`` opens ``--sessions`` sessions, gives each a
``--prompt``-token prompt, then times ``--ticks`` ticks in which every session appends a
``--frame``-token frame and decodes one token. Three engines, each in its own process, on the
same weights and the same contexts:

- ``window+sinks``: this backend (``KVPolicy.windowed(W, sinks=S)``);
- ``vllm full``: vLLM's stock Llama and attention kernel, full KV (no metronome layers);
- ``window+sinks @REF``: the backend as it was at git ``REF`` (default: the last commit
  before the one-pass CPU attention, when a window pass and a sink pass were merged by
  log-sum-exp; ``000c077`` is the per-request Python loop before those), extracted with
  ``git archive`` from the repository this file sits in.

Every figure is measured in this run; the ratio is against ``vllm full``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "run_one"]

BEFORE = "7bbc219"  # the last commit before the one-pass CPU attention (two passes merged by log-sum-exp)


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """One engine, one configuration: per-tick milliseconds at each session count (runs in its own process)."""
    from metronome_engine import KVPolicy, StepRequest
    from metronome_engine.vllm_backend import VLLMEngineCore

    policy = KVPolicy.windowed(spec["window"], sinks=spec["sinks"]) if spec["policy"] == "window" else KVPolicy.full()
    most, frame = max(spec["sessions"]), spec["frame"]
    kwargs: dict[str, Any] = {
        "policy": policy,
        "num_blocks": spec["num_blocks"],
        "block_size": spec["block_size"],
        "max_model_len": spec["max_model_len"],
        "max_num_seqs": most,
        "max_num_batched_tokens": max(2048, most * frame),
        "dtype": spec["dtype"],
        "load_format": spec["load_format"],
    }
    results: dict[str, Any] = {}
    with VLLMEngineCore(spec["model"], **kwargs) as core:
        for sessions in spec["sessions"]:
            ids = [core.add_sequence() for _ in range(sessions)]
            prompt = [(11 * k) % 1000 + 10 for k in range(spec["prompt"])]
            core.step([StepRequest(sid, prompt) for sid in ids])
            times: list[float] = []
            for t in range(spec["ticks"] + 2):
                reqs = [
                    StepRequest(sid, [(t * 13 + i + k) % 1000 + 10 for k in range(frame)]) for i, sid in enumerate(ids)
                ]
                t0 = time.perf_counter()
                outs = core.step(reqs)
                if t >= 2:  # two warm-up ticks
                    times.append(time.perf_counter() - t0)
                if not all(o.ok for o in outs):
                    raise RuntimeError(f"a session stalled: {[o for o in outs if not o.ok][:1]}")
            for sid in ids:
                core.free_sequence(sid)
            times.sort()
            results[str(sessions)] = {
                "p50_ms": 1e3 * statistics.median(times),
                "p90_ms": 1e3 * times[int(0.9 * (len(times) - 1))],
            }
    return results


def _baseline_tree(ref: str, into: Path) -> Path:
    """``engine_backend`` as it was at ``ref``, extracted under ``into``."""
    repo = Path(__file__).resolve().parents[3]
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", ref, "engine_backend/metronome_engine"],
        check=True,
        capture_output=True,
    ).stdout
    tar = into / "tree.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as f:
        f.extractall(into, filter="data")
    return into / "engine_backend"


def _spawn(spec: dict[str, Any], pythonpath: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    # this file's run_one, executed beside whichever metronome_engine PYTHONPATH puts first
    code = (
        "import json, runpy, sys; run_one = runpy.run_path(sys.argv[1])['run_one']; "
        "print('RESULT ' + json.dumps(run_one(json.loads(sys.argv[2]))))"
    )
    argv = [sys.executable, "-c", code, __file__, json.dumps(spec)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    raise RuntimeError(f"{spec['label']} failed:\n{done.stderr[-4000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--sessions", default="32", help="session counts, comma-separated: 1,32,200")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--frame", type=int, default=4)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--sinks", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--load-format", default="auto", help="'dummy': random weights from a config.json folder")
    parser.add_argument("--baseline-ref", default=BEFORE, help="git ref of today's backend; '' to skip it")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    counts = [int(n) for n in str(args.sessions).split(",")]
    context = args.prompt + (args.ticks + 2) * args.frame
    base = {
        "model": args.model,
        "sessions": counts,
        "prompt": args.prompt,
        "frame": args.frame,
        "ticks": args.ticks,
        "window": args.window,
        "sinks": args.sinks,
        "block_size": args.block_size,
        "dtype": args.dtype,
        "load_format": args.load_format,
        # full KV holds every session's whole context: size the pool and the table for it
        "num_blocks": max(counts) * (-(-context // args.block_size) + 1) + 8,
        "max_model_len": -(-(context + args.frame) // args.block_size) * args.block_size,
    }
    runs: list[tuple[str, dict[str, Any], str | None]] = [
        ("window+sinks", {**base, "policy": "window"}, None),
        ("vllm full", {**base, "policy": "full"}, None),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline_ref:
            tree = _baseline_tree(args.baseline_ref, Path(tmp))
            runs.append((f"window+sinks @{args.baseline_ref}", {**base, "policy": "window"}, str(tree)))
        measured = {}
        for label, spec, path in runs:
            measured[label] = _spawn({**spec, "label": label}, path)
            print(f"  {label}: done", file=sys.stderr, flush=True)
    rows = []
    for n in counts:
        full = measured["vllm full"][str(n)]["p50_ms"]
        for label, by_count in measured.items():
            r = by_count[str(n)]
            rows.append({"sessions": n, "config": label, **r, "vs_vllm_full": r["p50_ms"] / full})
    if args.json:
        print(json.dumps({"settings": base, "rows": rows}, indent=2))
    else:
        print(
            f"{args.frame}-token frames, contexts {args.prompt}-{context} tokens, "
            f"W={args.window} S={args.sinks}, {args.model} {args.dtype}"
        )
        print(f"{'sessions':>8} {'config':<28} {'p50 ms/tick':>12} {'p90 ms/tick':>12} {'x vllm full':>12}")
        for r in rows:
            figures = f"{r['p50_ms']:>12.1f} {r['p90_ms']:>12.1f} {r['vs_vllm_full']:>12.2f}"
            print(f"{r['sessions']:>8} {r['config']:<28} {figures}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
