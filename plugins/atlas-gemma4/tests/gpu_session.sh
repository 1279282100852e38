#!/usr/bin/env bash
# What the coordinator runs on the lent GPU for atlas-gemma4, from the repository root (under 5
# minutes). Logs go to $OUT (or ./gemma4_gpu_out); every step has its own time limit. NVRTC
# builds land in $ATLAS_CACHE_DIR: on a fresh machine the first steps pay for compiling
# (the attention modules ~40 s a dtype); a second run on the warm machine times the benches.
#   1. pytest -m gpu (first run compiles gemma4_attention(_mma).cu for f32 and bf16):
#      mul / softcap / sliding_window_attention on their contract cases, the attention kernels
#      at Gemma-4 shapes (head 256 window 1024, head 512 full) with blocks before the window
#      unset, and tiny Gemma-4 / Gemma-3 checkpoints: 32 greedy tokens on cuda = numpy with the
#      sliding-window KV pool on.
#   2. atlas bench (random bf16 weights on the device, 32 decode tokens a request): both shapes
#      at batch 1 and 32 at 1k context, then batch 1 at 32k. gemma-4-31b is 62 GB of weights:
#      on an 80 GB card its batch 32 cell is skipped for lack of KV memory (it needs an H200).
#      Batch 32 at 32k (a million prompt tokens, est. over a minute of prefill with the
#      untuned mma.sync tile kernel) is left out; a timeout records how far a cell got. Prefill chunks of 2,048 tokens: a chunk's keys must
#      all fit the sliding-window pool at once (16k-token chunks would need 14 GB of it on 31b).
#   3. HF transformers eager beside Atlas, batch 1 at 1k (8 baseline tokens; builds the random
#      model on the GPU in its own process): the baseline the issue asks for.
# The tests read the real chat templates: on a machine without ../shared, carry
# fixtures/real-models/gemma-4 and set ATLAS_FIXTURES_DIR to the folder holding it.
set -uo pipefail
OUT=${OUT:-$PWD/gemma4_gpu_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
$PY -m pip install -q --no-deps --no-build-isolation -e . -e plugins/atlas-cuda \
  -e plugins/atlas-hopper -e plugins/atlas-gemma4 >"$OUT/install.log" 2>&1 \
  || { tail "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
git log --oneline -1 2>/dev/null | tee -a "$OUT/gpu.txt"

timeout -s INT 150 $PY -m pytest -q -m gpu plugins/atlas-gemma4/tests -p no:cacheprovider \
  2>&1 | tee "$OUT/tests.log" | tail -20

bench() {  # bench SECONDS SHAPE BATCHES CONTEXT
  local log="$OUT/bench-$2-b${3/,/-}-c$4"
  timeout -s INT "$1" $PY -m atlas_core bench --model "$2" --backend cuda --batch "$3" \
    --context "$4" --decode-tokens 32 --max-prefill-tokens 2048 --gpu-memory-utilization 0.92 \
    --json "$log.json" >"$log.log" 2>&1
  echo "$2 batch $3 context $4: exit $?"
  tail -8 "$log.log"
}
bench 40 gemma-4-26b-a4b 1,32 1024
bench 40 gemma-4-31b 1,32 1024
bench 30 gemma-4-26b-a4b 1 32768
bench 30 gemma-4-31b 1 32768
for shape in gemma-4-26b-a4b gemma-4-31b; do
  log="$OUT/bench-$shape-hf"
  timeout -s INT 240 $PY -m atlas_core bench --model "$shape" --backend cuda --batch 1 \
    --context 1024 --decode-tokens 32 --max-prefill-tokens 2048 --gpu-memory-utilization 0.92 \
    --baseline hf --baseline-decode-tokens 8 --baseline-timeout 180 --json "$log.json" \
    >"$log.log" 2>&1
  echo "$shape beside HF, batch 1 context 1024: exit $?"
  tail -8 "$log.log"
done
