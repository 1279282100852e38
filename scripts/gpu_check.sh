#!/usr/bin/env bash
# Build, check and time everything on a lent GPU in one go (see docs/benchmarks.md).
#   scripts/gpu_check.sh [tests|sanitize|bench|all]...   (default: all)
# Logs go to $OUT (or ./gpu_check_out) so they come back from the device machine. Every step
# has its own time limit (seconds, env: TEST_TIMEOUT, SANITIZE_TIMEOUT, BENCH8B_TIMEOUT,
# BENCH06B_TIMEOUT) so the whole run fits a device call. nvmath-python (cuBLASLt) is taken from
# ./.whl when a wheel is there (device/README.md: wheels travel with the working tree).
set -uo pipefail
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
steps=${*:-all}
has() { [[ " $steps " == *" $1 "* || " $steps " == *" all "* ]]; }
t0=$SECONDS
stamp() { echo "== $1 at +$((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"; }

if ls .whl/nvmath_python-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    .whl/nvmath_python-*.whl >"$OUT/install.log" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  python3 -c "import nvmath.bindings.cublasLt" 2>>"$OUT/install.log" || {
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
      .whl/cuda_pathfinder-*.whl >>"$OUT/install.log" 2>&1; }
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/atlas-qwen3 \
  -e plugins/atlas-cuda -e plugins/atlas-hopper >>"$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "from nvmath.bindings import cublasLt as l; print('cuBLASLt', l.get_version())" 2>&1 | tail -1 | tee -a "$OUT/gpu.txt"
python3 -m atlas_core doctor >"$OUT/doctor.txt" 2>&1 || true
git log --oneline -1 2>/dev/null | tee -a "$OUT/gpu.txt"

if has tests; then
  stamp tests
  timeout -s INT ${TEST_TIMEOUT:-300} python3 -m pytest -q plugins/atlas-cuda/tests -p no:cacheprovider \
    2>&1 | tee "$OUT/tests.log" | grep -E "passed|failed|error|FAILED|ERROR" | tail -40
fi
if has sanitize; then
  stamp sanitize
  timeout -s INT ${SANITIZE_TIMEOUT:-120} compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 -m pytest -q -x plugins/atlas-cuda/tests/test_fast_paths_cuda.py \
    plugins/atlas-cuda/tests/test_ops_cuda.py -p no:cacheprovider >"$OUT/memcheck.log" 2>&1
  echo "memcheck exit $? ($(grep -c 'Invalid' "$OUT/memcheck.log") invalid accesses)"; tail -3 "$OUT/memcheck.log"
fi
bench() {  # name timeout args...
  local name=$1 limit=$2; shift 2
  stamp "bench $name"
  timeout -s ABRT "$limit" python3 -X faulthandler -m atlas_core bench "$@" \
    --json "$OUT/bench-$name.json" 2>&1 | tee "$OUT/bench-$name.log" | grep -v "^\[bench" | tail -25
}
if has bench; then
  if [[ -n "${BENCH_ARGS:-}" ]]; then
    bench custom "${BENCH_TIMEOUT:-400}" $BENCH_ARGS
  else
    bench 8b "${BENCH8B_TIMEOUT:-300}" --model qwen3-8b --concurrency 1,32 --prompt-len 4096 \
      --decode-tokens ${DECODE_TOKENS:-64} --copy-mb 2048 --baseline ${BASELINE:-hf}
    bench 06b "${BENCH06B_TIMEOUT:-120}" --model qwen3-0.6b --concurrency 1,32 --prompt-len 1024 \
      --decode-tokens ${DECODE_TOKENS:-64} --copy-mb 2048 --baseline ${BASELINE:-hf}
  fi
fi
stamp done
