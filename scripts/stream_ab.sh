#!/usr/bin/env bash
# One device call: streamed-GEMV tests, per-GEMV timings and batch-1 decode A/B
# (ATLAS_CUDA_GEMV_STREAM=0/1). Usage: bash scripts/stream_ab.sh [models...]
export ATLAS_CACHE_DIR=/tmp/atlas-cache PYTHONUNBUFFERED=1
bash scripts/gpu_check.sh none >/dev/null 2>&1
export PYTHONPATH=/tmp/site
OUT=${OUT:-/tmp}
python3 -m pytest -q -x plugins/atlas-cuda/tests/test_gemv_stream_cuda.py \
  plugins/atlas-cuda/tests/test_gemv_norm_cuda.py -p no:cacheprovider 2>&1 | tail -4
[[ "${GEMV_PATHS:-1}" != 0 ]] && timeout 200 python3 scripts/gemv_paths.py --stream 2>&1 | tail -30
for model in ${*:-qwen3-8b}; do
  for s in ${STREAM_SETTINGS:-0 1}; do
    echo "== $model ATLAS_CUDA_GEMV_STREAM=$s ${EXTRA_ENV:-}"
    env ATLAS_CUDA_GEMV_STREAM=$s ${EXTRA_ENV:-} timeout 150 python3 -m atlas_core bench --model "$model" \
      --backend cuda --concurrency 1 --prompt-len 128 --decode-tokens 128 --copy-mb 1024 \
      --baseline none --gpu-memory-utilization 0.85 --json "$OUT/bench-$model-$s.json" 2>&1 \
      | grep -iE "^ *1 \||roofline|error|Traceback" | head -6
  done
done
