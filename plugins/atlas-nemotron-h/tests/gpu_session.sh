#!/usr/bin/env bash
# What the coordinator runs on the lent GPU for atlas-nemotron-h, from the repository root
# (under 4 minutes). Logs go to $OUT (or ./nemotron_gpu_out); every step has its own limit.
#   1. pytest -m gpu: every op's contract cases on cuda (Mamba-2 conv / scan / gated norm,
#      relu2, routing, experts), a decode step and the MoE at Nano shapes replayed from CUDA
#      graphs, both expert paths (with and without the shared expert),
#      the tiny model's greedy tokens on cuda = numpy, bf16 logits near float32.
#   2. atlas bench nemotron-3-nano-30b-a3b (all 52 blocks, bf16, random weights on the device,
#      62.5 GB: H100 80 GB or H200): batch 1, 8, 32 at 1k context; then batch 1 at 32k (prefill
#      runs the token-by-token scan: slow). No baseline here: the compiled baseline is a Qwen3;
#      HF eager beside it (`--baseline hf --baseline-decode-tokens 8`, batch 1 and 8 at 1k) took
#      25 s on an H200 in session 20 (docs/benchmarks.md).
# The tests read the real chat templates: on a machine without ../shared, carry
# fixtures/real-models/nemotron and set ATLAS_FIXTURES_DIR to the folder holding it.
set -uo pipefail
OUT=${OUT:-$PWD/nemotron_gpu_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
$PY -m pip install -q --no-deps --no-build-isolation -e . -e plugins/atlas-cuda \
  -e plugins/atlas-hopper -e plugins/atlas-nemotron-h >"$OUT/install.log" 2>&1 \
  || { tail "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
git log --oneline -1 2>/dev/null | tee -a "$OUT/gpu.txt"

timeout -s INT 80 $PY -m pytest -q -m gpu plugins/atlas-nemotron-h/tests -p no:cacheprovider \
  2>&1 | tee "$OUT/tests.log" | tail -15

bench() {  # bench SECONDS BATCHES CONTEXT [EXTRA...]
  local secs=$1 batches=$2 context=$3
  shift 3
  timeout -s INT "$secs" $PY -m atlas_core bench --model nemotron-3-nano-30b-a3b --backend cuda \
    --batch "$batches" --context "$context" --decode-tokens 32 --gpu-memory-utilization 0.92 \
    --json "$OUT/bench-b${batches//,/-}-c$context.json" "$@" \
    >"$OUT/bench-b${batches//,/-}-c$context.log" 2>&1
  echo "nemotron-3-nano batch $batches context $context: exit $?"
  tail -8 "$OUT/bench-b${batches//,/-}-c$context.log"
}
bench 85 1,8,32 1024
bench 60 1 32768
