#!/usr/bin/env bash
# Build, check and time everything on a lent GPU in one go (see docs/benchmarks.md).
#   scripts/gpu_check.sh [tests|sanitize|bench|moetests|moe|moebench|serve|all]...   (default: all)
# Logs go to $OUT (or ./gpu_check_out) so they come back from the device machine. Every step
# has its own time limit (seconds, env: TEST_TIMEOUT, SANITIZE_TIMEOUT, BENCH8B_TIMEOUT,
# BENCH06B_TIMEOUT, MOETEST_TIMEOUT, MOE_TIMEOUT, BENCH30B_TIMEOUT, BENCH35B_TIMEOUT,
# SERVE_TIMEOUT) so the whole run fits a device call. nvmath-python (cuBLASLt) is taken from
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
  -e plugins/atlas-cuda -e plugins/atlas-hopper -e plugins/atlas-qwen35 >>"$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
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
  # the whole op contract on CUDA plus the fast-path and op tests, under memcheck
  timeout -s INT ${SANITIZE_TIMEOUT:-420} compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 -m pytest -q plugins/atlas-cuda/tests/test_contract_cuda.py \
    plugins/atlas-cuda/tests/test_fast_paths_cuda.py plugins/atlas-cuda/tests/test_ops_cuda.py \
    ${SANITIZE_EXTRA:-} -p no:cacheprovider >"$OUT/memcheck.log" 2>&1
  echo "memcheck exit $? ($(grep -c 'Invalid' "$OUT/memcheck.log") invalid accesses)"
  # the planted overrun must be reported, or a clean run above proves nothing
  compute-sanitizer --tool memcheck python3 scripts/sanitizer_canary.py >"$OUT/canary.log" 2>&1
  echo "memcheck canary: $(grep -c 'Invalid __global__' "$OUT/canary.log") invalid accesses reported (expected > 0)"
  grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck.log" | tail -3
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
if has moetests; then  # the MoE paths: own tests, contract, tiny Qwen3-MoE / hybrid parity
  stamp moetests
  timeout -s INT ${MOETEST_TIMEOUT:-100} python3 -m pytest -q -p no:cacheprovider \
    plugins/atlas-cuda/tests/test_moe_cuda.py plugins/atlas-cuda/tests/test_hf_parity_cuda.py \
    plugins/atlas-cuda/tests/test_gdn_cuda.py "plugins/atlas-cuda/tests/test_contract_cuda.py" \
    -k "moe or Moe or hf or hybrid or fill_random" 2>&1 | tee "$OUT/moetests.log" \
    | grep -E "passed|failed|error|FAILED|ERROR" | tail -20
fi
if has moe; then
  stamp moe
  timeout -s INT ${MOE_TIMEOUT:-45} python3 scripts/moe_paths.py 2>&1 | tee "$OUT/moe_paths.log" | tail -20
fi
if has moebench; then  # random weights filled on the device: no checkpoint on disk
  bench 30b "${BENCH30B_TIMEOUT:-120}" --model qwen3-30b-a3b --concurrency 1,32 --prompt-len 512 \
    --decode-tokens ${DECODE_TOKENS:-64} --copy-mb 2048 --gpu-memory-utilization 0.85 \
    --baseline ${BASELINE:-hf} --baseline-decode-tokens 8 --baseline-timeout 60
  # 0.6: a 4,096-token prefill's step workspace (all 40 layers' outputs) needs ~20+ GB free
  bench 35b "${BENCH35B_TIMEOUT:-170}" --model qwen3.5-35b-a3b --concurrency 1,32 --prompt-len 4096 \
    --decode-tokens ${DECODE_TOKENS:-64} --copy-mb 2048 --gpu-memory-utilization 0.6 \
    --baseline ${BASELINE:-hf} --baseline-decode-tokens 8 --baseline-timeout 100
fi
if has serve; then  # atlas serve cold start (8B checkpoint on disk; wheels from .whl)
  stamp serve
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    .whl/{litestar,litestar_htmx,msgspec,uvicorn,multipart,rich_click,sniffio,polyfactory,llguidance}-*.whl \
    >>"$OUT/install.log" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  timeout -s INT ${SERVE_TIMEOUT:-110} python3 scripts/serve_coldstart.py /tmp/serve-8b --runs 2 \
    --limit 45 2>&1 | tee "$OUT/serve.log" | tail -5
fi
stamp done
