#!/usr/bin/env bash
# Batch-1 decode of the MoE bench shapes, fused decode kernels against the separate ops, in one
# device call (docs/benchmarks.md): install as gpu_check.sh does, the fused-path GPU tests,
# scripts/moe_block_paths.py, `atlas bench` per configuration (random weights on the device),
# then scripts/decode_graph_time.py (device time of the decode graph alone) per configuration.
#   scripts/moe_decode_ab.sh            env: TESTS=0 skips the tests, REPEAT=2 runs each bench twice
# Logs go to $RAW; after every step they are packed into $OUT/moe_ab.tgz (one file comes back
# from the device machine even if a later step runs out of time).
set -uo pipefail
OUT=${OUT:-$PWD/moe_ab_out}
RAW=${RAW:-/tmp/moe_ab}
mkdir -p "$OUT" "$RAW"
export PYTHONUNBUFFERED=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
t0=$SECONDS
stamp() {
  tar czf "$OUT/moe_ab.tgz" -C "$RAW" . 2>/dev/null
  echo "== $1 at +$((SECONDS - t0)) s" | tee -a "$RAW/steps.txt"
}
OUT=$RAW/gpu_check scripts/gpu_check.sh install >"$RAW/install_step.txt" 2>&1 \
  || { cat "$RAW/install_step.txt"; exit 1; }
head -3 "$RAW/gpu_check/gpu.txt"
if [[ "${TESTS:-1}" != 0 ]]; then
  stamp tests
  timeout -s INT ${TEST_TIMEOUT:-90} python3 -m pytest -q -p no:cacheprovider \
    plugins/atlas-cuda/tests/test_moe_cuda.py plugins/atlas-qwen35/tests/test_gdn_cuda.py \
    plugins/atlas-cuda/tests/test_contract_cuda.py \
    -k "moe_block or gated_delta_rule_decode or decode_step or fused" \
    2>&1 | tee "$RAW/tests.log" | grep -E "passed|failed|error|FAILED|ERROR" | tail -12
fi
stamp moe_block_paths
timeout -s INT 40 python3 scripts/moe_block_paths.py 2>&1 | tee "$RAW/moe_block_paths.log" | tail -13
bench() {  # tag moe_fused gdn_fused model util
  stamp "bench $1"
  ATLAS_CUDA_MOE_FUSED=$2 ATLAS_CUDA_GDN_FUSED=$3 timeout -s ABRT ${BENCH_TIMEOUT:-45} \
    python3 -m atlas_core bench --model "$4" --concurrency 1 --prompt-len 128 --decode-tokens 64 \
    --copy-mb 2048 --gpu-memory-utilization "$5" --baseline none --json "$RAW/bench-$1.json" \
    >"$RAW/bench-$1.log" 2>&1
  echo "$1 (moe_fused=$2 gdn_fused=$3): $(grep -E '^ +1 \|' "$RAW/bench-$1.log" || tail -2 "$RAW/bench-$1.log")"
}
graph_time() {  # tag moe_fused gdn_fused model util
  stamp "graph $1"
  ATLAS_CUDA_MOE_FUSED=$2 ATLAS_CUDA_GDN_FUSED=$3 timeout -s ABRT ${GRAPH_TIMEOUT:-40} \
    python3 scripts/decode_graph_time.py "$4" --gpu-memory-utilization "$5" >"$RAW/graph-$1.log" 2>&1
  echo "$1 (moe_fused=$2 gdn_fused=$3): $(tail -1 "$RAW/graph-$1.log")"
}
for r in $(seq ${REPEAT:-1}); do
  bench "35b-old-$r" 0 0 qwen3.5-35b-a3b 0.6
  bench "35b-new-$r" 1 1 qwen3.5-35b-a3b 0.6
  bench "30b-old-$r" 0 0 qwen3-30b-a3b 0.85
  bench "30b-new-$r" 1 1 qwen3-30b-a3b 0.85
done
graph_time 35b-old 0 0 qwen3.5-35b-a3b 0.6
graph_time 35b-new 1 1 qwen3.5-35b-a3b 0.6
graph_time 30b-old 0 0 qwen3-30b-a3b 0.85
graph_time 30b-new 1 1 qwen3-30b-a3b 0.85
bench 35b-moe-only 1 0 qwen3.5-35b-a3b 0.6
stamp done
