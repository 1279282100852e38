#!/usr/bin/env bash
# Every GPU correctness check of the tree in one device call, run side by side (they share the
# GPU but not the NVRTC cache, so none waits on another's compile):
#   A  the atlas-cuda suite plus the plugins' cuda tests (GDN, MiniMax, Gemma-4 gpu marker)
#   B  compute-sanitizer memcheck over the op contract, fast paths and op tests (+ the canary)
#   C  quantized weights (ATLAS_CUDA_QUANT_WEIGHTS=1): gpu tests, quantized contract cases
# No timing here: timings come from scripts/ab_trees.sh / gpu_check.sh bench on an idle GPU.
# Limits per job: CORRECT_TIMEOUT (default 540 s). Logs in $OUT (or ./gpu_correct_out).
set -uo pipefail
OUT=${OUT:-$PWD/gpu_correct_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
limit=${CORRECT_TIMEOUT:-540}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  >"$OUT/wheels.log" 2>&1 || tail -3 "$OUT/wheels.log"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/atlas-qwen3 \
  -e plugins/atlas-cuda -e plugins/atlas-hopper -e plugins/atlas-qwen35 -e plugins/atlas-gb10 \
  -e plugins/atlas-gemma4 -e plugins/atlas-minimax ${EXTRA_PLUGINS:-} >"$OUT/install.log" 2>&1 \
  || { tail "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
git log --oneline -1 2>/dev/null | tee -a "$OUT/gpu.txt"
t0=$SECONDS
(ATLAS_CACHE_DIR=/tmp/cache-a timeout -s INT "$limit" python3 -m pytest -q -p no:cacheprovider \
   plugins/atlas-cuda/tests plugins/atlas-qwen35/tests/test_gdn_cuda.py \
   plugins/atlas-qwen35/tests/test_engine_hybrid_async.py plugins/atlas-minimax/tests/test_minimax_cuda.py \
   ${SUITE_EXTRA:-} >"$OUT/suite.log" 2>&1; echo "suite exit $? at +$((SECONDS - t0)) s" >>"$OUT/exits.txt") &
(ATLAS_CACHE_DIR=/tmp/cache-b timeout -s INT "$limit" compute-sanitizer --tool memcheck --error-exitcode 9 \
   python3 -m pytest -q -p no:cacheprovider plugins/atlas-cuda/tests/test_contract_cuda.py \
   plugins/atlas-cuda/tests/test_fast_paths_cuda.py plugins/atlas-cuda/tests/test_ops_cuda.py \
   plugins/atlas-cuda/tests/test_quant_cuda.py \
   >"$OUT/memcheck.log" 2>&1; echo "memcheck exit $? at +$((SECONDS - t0)) s ($(grep -c 'Invalid' "$OUT/memcheck.log") invalid accesses)" >>"$OUT/exits.txt"
 ATLAS_CACHE_DIR=/tmp/cache-b compute-sanitizer --tool memcheck python3 scripts/sanitizer_canary.py >"$OUT/canary.log" 2>&1
 echo "canary: $(grep -c 'Invalid __global__' "$OUT/canary.log") invalid accesses reported (expected > 0)" >>"$OUT/exits.txt") &
(ATLAS_CACHE_DIR=/tmp/cache-c ATLAS_CUDA_QUANT_WEIGHTS=1 timeout -s INT "$limit" python3 -m pytest -q \
   -p no:cacheprovider plugins/atlas-cuda/tests/test_quant_cuda.py \
   plugins/atlas-cuda/tests/test_contract_cuda.py -k "quant or Quant" \
   >"$OUT/quant.log" 2>&1; echo "quant exit $? at +$((SECONDS - t0)) s" >>"$OUT/exits.txt") &
wait
cat "$OUT/exits.txt"
for f in suite memcheck quant; do
  echo "== $f"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/$f.log" | tail -25
done
grep -E "ERROR SUMMARY" "$OUT/memcheck.log" | tail -2
