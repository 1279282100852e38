#!/usr/bin/env bash
# The qwen3-8b decode matrix for quantized weights before/after in one device call (#22 / #21):
# bf16 with the compiled-PyTorch baseline, then FP8 and NVFP4 with the older kernels
# (ATLAS_CUDA_QUANT_KERNEL=legacy) and the default ones, batches x contexts, decode AT the context.
#   scripts/quant_matrix.sh   (env: BATCHES, CONTEXTS, DECODE_TOKENS, LIMIT seconds a run (the
#   bf16 run with its compiled baseline needs ~300), FORMATS ("fp8 nvfp4"; empty: bf16 only),
#   LEGACY (1: also the older kernels; 0: the default ones only))
# Logs and JSON go to $OUT (or ./quant_matrix_out).
set -uo pipefail
OUT=${OUT:-$PWD/quant_matrix_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATLAS_CUDA_QUANT_WEIGHTS=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
if ls .whl/nvmath_python-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    .whl/nvmath_python-*.whl >"$OUT/install.log" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/atlas-qwen3 \
  -e plugins/atlas-cuda -e plugins/atlas-hopper >>"$OUT/install.log" 2>&1 \
  || { tail "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
run() {  # name, then atlas bench args
  local name=$1; shift
  echo "== $name"
  timeout -s ABRT "${LIMIT:-170}" python3 -m atlas_core bench "$@" --batch "${BATCHES:-1,2,4,8,16,32}" \
    --context "${CONTEXTS:-1024,8192}" --decode-tokens "${DECODE_TOKENS:-24}" --copy-mb 2048 \
    --json "$OUT/$name.json" 2>&1 | tee "$OUT/$name.log" | grep -E "^ *[0-9]+ \||^batch|baseline|compiled" | grep -v TTFT
}
run bf16 --model qwen3-8b --baseline compiled
for fmt in ${FORMATS-fp8 nvfp4}; do
  [[ ${LEGACY:-1} == 1 ]] && ATLAS_CUDA_QUANT_KERNEL=legacy run "$fmt-legacy" --model "qwen3-8b-$fmt"
  run "$fmt-skinny" --model "qwen3-8b-$fmt"
done
