#!/usr/bin/env bash
# What the coordinator runs on the lent GPU for atlas-minimax, from the repository root (about
# 4 minutes). Logs go to $OUT (or ./minimax_gpu_out); every step has its own time limit.
#   1. pytest -m gpu: moe_route_biased against its reference on the contract cases, and the tiny
#      MiniMax-M2 checkpoint's 32 greedy tokens on cuda = numpy (top logprobs within 1e-4).
#   2. atlas bench minimax-m2 (5 of 62 layers, bf16, random weights on the device): batch 1 and
#      32 at 1k context, then at 32k (20 GiB of KV at batch 32); per-layer cost = step / 5.
#   3. HF transformers eager beside Atlas on the same 5-layer shape, batch 1 at 1k (8 baseline
#      tokens): the baseline the issue asks for.
# The tests read the real chat template: on a machine without ../shared, carry
# fixtures/real-models/minimax-m2 and set ATLAS_FIXTURES_DIR to the folder holding it.
set -uo pipefail
OUT=${OUT:-$PWD/minimax_gpu_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
$PY -m pip install -q --no-deps --no-build-isolation -e . -e plugins/atlas-cuda \
  -e plugins/atlas-hopper -e plugins/atlas-minimax >"$OUT/install.log" 2>&1 \
  || { tail "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
git log --oneline -1 2>/dev/null | tee -a "$OUT/gpu.txt"

timeout -s INT 90 $PY -m pytest -q -m gpu plugins/atlas-minimax/tests -p no:cacheprovider \
  2>&1 | tee "$OUT/tests.log" | tail -15

bench() {  # bench SECONDS BATCHES CONTEXT
  timeout -s INT "$1" $PY -m atlas_core bench --model minimax-m2 --backend cuda --batch "$2" \
    --context "$3" --decode-tokens 32 --gpu-memory-utilization 0.9 \
    --json "$OUT/bench-b${2/,/-}-c$3.json" >"$OUT/bench-b${2/,/-}-c$3.log" 2>&1
  echo "minimax-m2 batch $2 context $3: exit $?"
  tail -8 "$OUT/bench-b${2/,/-}-c$3.log"
}
bench 60 1,32 1024
bench 80 1,32 32768
timeout -s INT 200 $PY -m atlas_core bench --model minimax-m2 --backend cuda --batch 1 \
  --context 1024 --decode-tokens 32 --gpu-memory-utilization 0.9 --baseline hf \
  --baseline-decode-tokens 8 --baseline-timeout 150 --json "$OUT/bench-hf.json" \
  >"$OUT/bench-hf.log" 2>&1
echo "minimax-m2 beside HF, batch 1 context 1024: exit $?"
tail -8 "$OUT/bench-hf.log"
