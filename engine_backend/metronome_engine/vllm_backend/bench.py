"""Per-tick time of the vLLM backend: window + sinks against vLLM's own attention, same run.

``python -m metronome_engine.vllm_backend.bench`` opens ``--sessions`` sessions, gives each a
``--prompt``-token prompt, then times ``--ticks`` ticks in which every session appends a
``--frame``-token frame and decodes one token. Three engines, each in its own process, on the
same weights and the same contexts, their ticks taken in turn (so that a shared machine's
load falls on each alike):

- ``window+sinks``: this backend (``KVPolicy.windowed(W, sinks=S)``);
- ``vllm full``: vLLM's stock Llama and attention kernel, full KV (no metronome layers);
- ``window+sinks @REF``: the backend as it was at git ``REF`` (default: the last commit
  before the C++ kernel, when the CPU ran the one-pass torch attention that copies each
  tile's blocks; ``7bbc219`` is the two passes merged by log-sum-exp before it, ``000c077``
  the per-request Python loop before those), extracted with ``git archive`` from the
  repository this file sits in.

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

__all__ = ["TickWorker", "main", "run_interleaved", "serve_ticks"]

BEFORE = "170989d"  # the last commit before the C++ kernel (the one-pass torch attention on CPU)


def serve_ticks(spec: dict[str, Any]) -> None:
    """One engine, driven line by line on stdin (runs in its own process; answers on stdout as ``@@ ...``).

    ``open N``: open N sessions and give each the prompt; ``open-contexts C1,C2,...``: one
    session per length, each given a prompt of that many tokens (none for 0); ``tick T [F]``:
    every session appends tick T's frame (``F`` tokens, else the spec's) and decodes one
    token, answered with the seconds it took; ``free``: close the sessions; ``quit``. The
    driver alternates the engines tick by tick, so each configuration sees the same load on a
    shared machine.
    """
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
    import torch

    if torch.cuda.is_available():  # the engines share the device: each takes its part of its memory
        kwargs["engine_args"] = {"gpu_memory_utilization": spec["device_share"]}
    with VLLMEngineCore(spec["model"], **kwargs) as core:
        print("@@ ready", flush=True)
        ids: list[int] = []
        for line in sys.stdin:
            command, _, arg = line.strip().partition(" ")
            if command in ("open", "open-contexts"):
                lengths = [spec["prompt"]] * int(arg) if command == "open" else [int(c) for c in arg.split(",")]
                ids = [core.add_sequence() for _ in lengths]
                prompts = [[(11 * k) % 1000 + 10 for k in range(n)] for n in lengths]
                if any(lengths):
                    core.step([StepRequest(sid, p) for sid, p in zip(ids, prompts, strict=True) if p])
                print("@@ opened", flush=True)
            elif command == "tick":
                t_arg, _, f_arg = arg.partition(" ")
                t, width = int(t_arg), int(f_arg or frame)
                reqs = [
                    StepRequest(sid, [(t * 13 + i + k) % 1000 + 10 for k in range(width)]) for i, sid in enumerate(ids)
                ]
                t0 = time.perf_counter()
                outs = core.step(reqs)
                elapsed = time.perf_counter() - t0
                if not all(o.ok for o in outs):
                    raise RuntimeError(f"a session stalled: {[o for o in outs if not o.ok][:1]}")
                print(f"@@ {elapsed}", flush=True)
            elif command == "free":
                for sid in ids:
                    core.free_sequence(sid)
                ids = []
                print("@@ freed", flush=True)
            else:
                break


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


class TickWorker:
    """A ``serve_ticks`` process beside whichever ``metronome_engine`` its PYTHONPATH puts first, run
    by ``python`` (another venv's interpreter: vLLM's) or this one, with ``env_extra`` set."""

    def __init__(
        self,
        spec: dict[str, Any],
        pythonpath: str | None,
        python: str | None = None,
        env_extra: dict[str, str] | None = None,
    ) -> None:
        env = {**os.environ, **(env_extra or {})}
        if pythonpath is not None:
            env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
        # this file's serve_ticks, run against the backend on that path
        code = "import json, runpy, sys; runpy.run_path(sys.argv[1])['serve_ticks'](json.loads(sys.argv[2]))"
        argv = [python or sys.executable, "-c", code, __file__, json.dumps(spec)]
        self.label = str(spec["label"])
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by close())
        self._proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True
        )
        self.ask(None)  # "ready": the engine is up

    def ask(self, command: str | None) -> str:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        if command is not None:
            self._proc.stdin.write(command + "\n")
            self._proc.stdin.flush()
        for line in self._proc.stdout:  # vLLM logs to stdout too: answers are the "@@ " lines
            if line.startswith("@@ "):
                return line[3:].strip()
        self._log.seek(0)
        raise RuntimeError(f"{self.label} failed:\n{self._log.read()[-4000:]}")

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.write("quit\n")
            self._proc.stdin.close()
            self._proc.wait(timeout=120)
        self._log.close()


def run_interleaved(
    specs: list[tuple[dict[str, Any], str | None]], counts: list[int], ticks: int
) -> dict[str, dict[str, Any]]:
    """Per-tick milliseconds of each engine at each session count, the engines' ticks taken in turn."""
    workers: list[TickWorker] = []
    try:
        for spec, path in specs:
            workers.append(TickWorker(spec, path))
            print(f"  {spec['label']}: started", file=sys.stderr, flush=True)
        measured: dict[str, dict[str, Any]] = {w.label: {} for w in workers}
        for n in counts:
            for w in workers:
                w.ask(f"open {n}")
            times: dict[str, list[float]] = {w.label: [] for w in workers}
            for t in range(ticks + 2):
                # rotate who goes first, so no engine always follows the same one
                for k in range(len(workers)):
                    w = workers[(t + k) % len(workers)]
                    elapsed = float(w.ask(f"tick {t}"))
                    if t >= 2:  # two warm-up ticks
                        times[w.label].append(elapsed)
            for w in workers:
                w.ask("free")
                ts = sorted(times[w.label])
                measured[w.label][str(n)] = {
                    "p50_ms": 1e3 * statistics.median(ts),
                    "p90_ms": 1e3 * ts[int(0.9 * (len(ts) - 1))],
                }
        return measured
    finally:
        for w in workers:
            w.close()


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
    parser.add_argument("--dtype", default=None, help="default: the engine's (bfloat16 on CUDA, float32 elsewhere)")
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
    runs: list[tuple[dict[str, Any], str | None]] = [
        ({**base, "policy": "window", "label": "window+sinks"}, None),
        ({**base, "policy": "full", "label": "vllm full"}, None),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline_ref:
            tree = _baseline_tree(args.baseline_ref, Path(tmp))
            runs.append(({**base, "policy": "window", "label": f"window+sinks @{args.baseline_ref}"}, str(tree)))
        runs = [({**spec, "device_share": round(0.85 / len(runs), 3)}, path) for spec, path in runs]
        measured = run_interleaved(runs, counts, args.ticks)
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
            f"W={args.window} S={args.sinks}, {args.model} {args.dtype or 'default dtype'}"
        )
        print(f"{'sessions':>8} {'config':<28} {'p50 ms/tick':>12} {'p90 ms/tick':>12} {'x vllm full':>12}")
        for r in rows:
            figures = f"{r['p50_ms']:>12.1f} {r['p90_ms']:>12.1f} {r['vs_vllm_full']:>12.2f}"
            print(f"{r['sessions']:>8} {r['config']:<28} {figures}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
