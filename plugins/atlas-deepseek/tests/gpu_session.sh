#!/usr/bin/env bash
# What the coordinator runs on the lent GPU for atlas-deepseek / atlas-mistral, from the
# repository root (under 5 minutes). Logs go to $OUT (or ./deepseek_gpu_out); every step has its
# own time limit.
#   1. pytest -m gpu: every case of the MLA / grouped-routing CUDA ops against its reference;
#      tiny DeepSeek-V3 and Mistral-4 checkpoints: 32 greedy tokens on cuda = numpy (top
#      logprobs within 1e-4), decode steps from CUDA graphs.
#   2. scripts/mla_decode_bench.py: absorbed decode attention at batch 1/8/32 and context 1k/32k,
#      microseconds and % of the latent-KV read floor, beside core GQA paged_attention.
#   3. atlas bench deepseek-v3 (3 of 61 layers) and mistral-small-4 (8 of 36 layers), bf16,
#      random weights on the device: batch 1, 8, 32 at 1k context; mistral-small-4 batch 1 at
#      32k (prefill attention runs on CUDA cores: batch 32 at 32k is left to step 2's kernel
#      bench). The start-up log states the latent KV bytes per token.
set -uo pipefail
OUT=${OUT:-$PWD/deepseek_gpu_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
$PY -m pip install -q --no-deps --no-build-isolation -e . -e plugins/atlas-cuda \
  -e plugins/atlas-hopper -e plugins/atlas-deepseek -e plugins/atlas-mistral \
  >"$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
git log --oneline -1 2>/dev/null | tee -a "$OUT/gpu.txt"

timeout -s INT 150 $PY -m pytest -q -m gpu plugins/atlas-deepseek/tests -p no:cacheprovider \
  2>&1 | tee "$OUT/tests.log" | tail -15

timeout -s INT 35 $PY scripts/mla_decode_bench.py 2>&1 \
  | tee "$OUT/decode_attention.log" | tail -20

bench() {  # bench SECONDS SHAPE BATCHES CONTEXT
  local tag="$2-b${3//,/-}-c$4"
  ATLAS_LOG_LEVEL=INFO timeout -s INT "$1" $PY -m atlas_core bench --model "$2" --backend cuda \
    --batch "$3" --context "$4" --decode-tokens 32 --gpu-memory-utilization 0.9 \
    --json "$OUT/bench-$tag.json" >"$OUT/bench-$tag.log" 2>&1
  echo "$2 batch $3 context $4: exit $?"
  grep -m1 "bytes per token" "$OUT/bench-$tag.log"
  tail -8 "$OUT/bench-$tag.log"
}
bench 35 deepseek-v3 1,8,32 1024
bench 35 mistral-small-4 1,8,32 1024
bench 50 mistral-small-4 1 32768
