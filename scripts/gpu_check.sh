#!/usr/bin/env bash
# First contact of the vLLM backend's CUDA path with a GPU: at most 5 minutes on one H100/H200.
# UNTESTED: no GPU has run this script (nor the CUDA path it checks); its first run is its test.
#
# Four stages (scripts/gpu_check.py holds each; its docstring says what each checks):
#   imports  torch, vLLM, CUDA; the plugin registers; the FlashAttention backend is picked for bf16
#   forward  SinkWindowFlashImpl.forward vs the dense float32 reference, paged bf16 cache with junk
#            in its freed blocks, sync debug mode "error", one CUDA graph capture and replay
#   e2e      a tiny Llama: windowed eager vs compiled-with-graphs vs the float32 torch runner,
#            beside the full policy's bf16/fp32 agreement (the yardstick)
#   scale    a Llama-1B-shaped model, dummy weights, 200 sessions: one forward a tick, blocks within
#            the bound, no preemption, host vs GPU time per tick (the 8B shape: a second run, --size 8b)
# A stage that fails or runs past its budget is recorded and the next one runs. Every figure lands in
# the output folder: STAGE.json and STAGE.log per stage, summary.txt (stage, exit status, seconds).
# Installs nothing: run it where `pip install -e ".[vllm]"` ran.
#
# Usage: scripts/gpu_check.sh [--out DIR] [--size 1b|8b] [--dry-run]
#        (DIR defaults to $OUT, else gpu-check/)
set -uo pipefail  # no -e: a failing stage must not stop the others
cd "$(dirname "$0")/.."

out="${OUT:-gpu-check}"
size=1b
dry_run=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-python}"

# stage and its budget in seconds: 300 in all
STAGES="imports:20 forward:50 e2e:110 scale:120"

if [ "$dry_run" = 1 ]; then
  for entry in $STAGES; do
    stage="${entry%%:*}"
    echo "stage $stage (at most ${entry##*:} s): timeout ${entry##*:} $PY scripts/gpu_check.py $stage --out $out --size $size"
  done
  echo "figures would land in $out/: <stage>.json, <stage>.log, summary.txt"
  exit 0
fi

mkdir -p "$out"
summary="$out/summary.txt"
echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) $(git rev-parse --short HEAD 2>/dev/null || echo no-git)" > "$summary"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$summary" 2>&1 || true
failed=0
for entry in $STAGES; do
  stage="${entry%%:*}"
  budget="${entry##*:}"
  start=$(date +%s.%N)
  timeout --kill-after=10 "$budget" "$PY" scripts/gpu_check.py "$stage" --out "$out" --size "$size" \
    > "$out/$stage.log" 2>&1
  rc=$?
  seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  verdict=ok
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then verdict="timed out after ${budget} s"; fi
  if [ "$rc" != 0 ] && [ "$verdict" = ok ]; then verdict=failed; fi
  [ "$rc" = 0 ] || failed=$((failed + 1))
  echo "$stage rc=$rc ${seconds}s $verdict" | tee -a "$summary"
  [ "$rc" = 0 ] || tail -n 5 "$out/$stage.log" | sed 's/^/    /' | tee -a "$summary"
done
echo "$failed of 4 stages failed; figures in $out/" | tee -a "$summary"
exit "$failed"
