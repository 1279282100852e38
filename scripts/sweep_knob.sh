#!/usr/bin/env bash
# Decode step time of bench shapes under several values of one cuda policy variable, in one
# device call (a crossover measured, not guessed: docs/kernels.md):
#   scripts/sweep_knob.sh ATLAS_CUDA_GEMV_ROWS "8 4 2 1" -- qwen3-8b qwen3-8b-fp8
# env: BATCH (1,2,4,8,16), CONTEXT (512), DECODE (32), BENCH_TIMEOUT (120 s a run), QUANT (1:
# ATLAS_CUDA_QUANT_WEIGHTS=1). Logs and --json files in $OUT (or ./sweep_out).
set -uo pipefail
OUT=${OUT:-$PWD/sweep_out}
mkdir -p "$OUT"
var=$1 values=$2
shift 2; [[ ${1:-} == "--" ]] && shift
export PYTHONUNBUFFERED=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
export ATLAS_CUDA_QUANT_WEIGHTS=${QUANT:-1}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  >"$OUT/wheels.log" 2>&1 || tail -3 "$OUT/wheels.log"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/atlas-qwen3 \
  -e plugins/atlas-cuda -e plugins/atlas-hopper -e plugins/atlas-qwen35 >"$OUT/install.log" 2>&1 \
  || { tail "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1 2>/dev/null
for model in "$@"; do
  for value in $values; do
    util=0.85; [[ $model == qwen3.5-* ]] && util=0.6
    log="$OUT/$model-$var-$value.log"
    env "$var=$value" timeout -s ABRT "${BENCH_TIMEOUT:-120}" python3 -m atlas_core bench \
      --model "$model" --backend cuda --batch "${BATCH:-1,2,4,8,16}" --context "${CONTEXT:-512}" \
      --decode-tokens "${DECODE:-32}" --copy-mb 1024 --baseline none \
      --gpu-memory-utilization "$util" --json "$OUT/$model-$var-$value.json" >"$log" 2>&1
    echo "== $model $var=$value"; grep -E '^ +[0-9]+ \| +[0-9]+ \| +[0-9.]+ \| +[0-9.,]+ \| +[0-9.]+ \| +[0-9.]+%' "$log" || tail -3 "$log"
  done
done
