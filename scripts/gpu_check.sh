#!/usr/bin/env bash
# Build, check and time everything on a lent GPU in one go (see docs/benchmarks.md).
#   scripts/gpu_check.sh [tests|sanitize|bench|all]...   (default: all)
# Logs go to $OUT (or ./gpu_check_out) so they come back from the device machine.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
steps=${*:-all}
has() { [[ " $steps " == *" $1 "* || " $steps " == *" all "* ]]; }

python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/atlas-qwen3 \
  -e plugins/atlas-cuda -e plugins/atlas-hopper >"$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -m atlas_core doctor 2>&1 | tee "$OUT/doctor.txt" || true

if has tests; then
  python3 -m pytest -q plugins/atlas-cuda/tests -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -25
fi
if has sanitize; then
  compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -x \
    plugins/atlas-cuda/tests/test_ops_cuda.py -p no:cacheprovider >"$OUT/memcheck.log" 2>&1
  echo "memcheck exit $? ($(grep -c 'Invalid' "$OUT/memcheck.log") invalid accesses)"; tail -3 "$OUT/memcheck.log"
fi
if has bench; then
  timeout -s ABRT ${BENCH_TIMEOUT:-400} python3 -X faulthandler -m atlas_core bench ${BENCH_ARGS:---model qwen3-0.6b --baseline hf} --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -30
fi
