#!/usr/bin/env bash
# Quantized weights on a lent Hopper GPU in one device call (issue #22):
#   scripts/quant_check.sh [tests|bench|moebench|all]...   (default: tests bench)
# tests:    the gpu tests of the quantized ops (plugins/atlas-cuda/tests/test_quant_cuda.py), the
#           op contract's quantized cases on cuda (every format, both dtypes; H11's
#           atlas_core/testing/quant_cases.py), and the host tests of the same code (kernel
#           choice, scale indexing, GB10 layout).
# bench:    atlas bench, random weights filled on the device, batch 1 and 8 at 512 tokens of
#           context: qwen3-8b (bf16) beside qwen3-8b-fp8 and qwen3-8b-nvfp4.
# skinny:   scripts/quant_skinny_bench.py: the decode kernels against NumPy, then qwen3-8b's
#           projections 1-64 rows, skinny vs legacy kernels, % of the memory floor.
# sweep:    scripts/quant_skinny_bench.py --sweep: every qskinny2 (MT, depth) per format and rows.
# moebench: qwen3-30b-a3b-fp8 and qwen3.5-35b-a3b-nvfp4 at batch 1 (decode reads only the
#           chosen experts; the prefill dequantizes every expert of a layer per chunk).
# moe:      the tensor-core decode MoE experts: their gpu tests, then qwen3.5-35b-a3b-nvfp4 and
#           qwen3-30b-a3b-fp8 at batch 1 and 8 (1,024 tokens), default kernels against
#           ATLAS_CUDA_QUANT_KERNEL=legacy (~8 min with a cold NVRTC cache).
# kvfp4:    the nvfp4 KV cache (--kv-cache-dtype nvfp4): its gpu tests (write-kernel bytes,
#           decode / prefill against NumPy, tiny Qwen3 cuda vs numpy) and host tests, then the
#           op contract's nvfp4 KV cases on cuda (~3 min with a cold NVRTC cache).
# kvbench:  atlas bench qwen3-8b at 32k tokens of context, batch 1 and 4, bf16 KV beside nvfp4
#           KV (KVBENCH_TIMEOUT per run, default 240 s; a device call of its own).
# Expected run time on an H200 (NVRTC cache cold): install ~30 s, tests ~3 min (first builds of
# quant_linear / quant_gemm / quant_moe.cu, 10-30 s each per dtype), bench ~5 min (three 8B
# models, ~90 s each): ~9 min for the default steps, inside one 10-minute device command but
# close; `scripts/quant_check.sh tests` and `... bench` split it. moebench: another ~5 min.
# Each step has its own limit (env: TEST_TIMEOUT, BENCH_TIMEOUT, MOEBENCH_TIMEOUT, seconds).
# Logs go to $OUT (or ./quant_check_out).
set -uo pipefail
OUT=${OUT:-$PWD/quant_check_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATLAS_CUDA_QUANT_WEIGHTS=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
steps=${*:-tests bench}
has() { [[ " $steps " == *" $1 "* || " $steps " == *" all "* ]]; }
t0=$SECONDS
stamp() { echo "== $1 at +$((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"; }

if ls .whl/nvmath_python-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    .whl/nvmath_python-*.whl >"$OUT/install.log" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/atlas-qwen3 \
  -e plugins/atlas-cuda -e plugins/atlas-hopper -e plugins/atlas-qwen35 -e plugins/atlas-gb10 \
  >>"$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
git log --oneline -1 2>/dev/null | tee -a "$OUT/gpu.txt"

if has tests; then
  stamp tests
  timeout -s INT "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider \
    plugins/atlas-cuda/tests/test_quant_cuda.py plugins/atlas-cuda/tests/test_ops_quant_host.py \
    plugins/atlas-gb10/tests/test_nvfp4_mma_quant_host.py tests/test_bench_quant_host.py \
    plugins/atlas-cuda/tests/test_contract_cuda.py -k "quant or Quant" \
    2>&1 | tee "$OUT/tests.log" | grep -E "passed|failed|error|FAILED|ERROR" | tail -40
fi
bench() {  # name timeout args...
  local name=$1 limit=$2; shift 2
  stamp "bench $name"
  timeout -s ABRT "$limit" python3 -X faulthandler -m atlas_core bench "$@" \
    --json "$OUT/bench-$name.json" 2>&1 | tee "$OUT/bench-$name.log" | grep -v "^\[bench" | tail -20
}
if has sweep; then
  stamp sweep
  timeout -s ABRT "${SWEEP_TIMEOUT:-400}" python3 -X faulthandler scripts/quant_skinny_bench.py \
    --sweep 2>&1 | tee "$OUT/sweep.log" | grep -E "^best|WRONG|FAILED|Error" | tail -40
fi
if has skinny; then
  stamp skinny
  timeout -s ABRT "${SKINNY_TIMEOUT:-240}" python3 -X faulthandler scripts/quant_skinny_bench.py \
    2>&1 | tee "$OUT/skinny.log" | tail -40
fi
if has bench; then
  for model in qwen3-8b qwen3-8b-fp8 qwen3-8b-nvfp4; do
    bench "$model" "${BENCH_TIMEOUT:-150}" --model "$model" --concurrency "${CONCURRENCY:-1,8}" --prompt-len 512 \
      --decode-tokens "${DECODE_TOKENS:-64}" --copy-mb 2048
  done
fi
if has moebench; then
  bench 30b-fp8 "${MOEBENCH_TIMEOUT:-150}" --model qwen3-30b-a3b-fp8 --concurrency 1 \
    --prompt-len 512 --decode-tokens 32 --copy-mb 2048 --gpu-memory-utilization 0.85
  bench 35b-nvfp4 "${MOEBENCH_TIMEOUT:-150}" --model qwen3.5-35b-a3b-nvfp4 --concurrency 1 \
    --prompt-len 512 --decode-tokens 32 --copy-mb 2048 --gpu-memory-utilization 0.6
fi
if has moe; then  # the tensor-core MoE experts (quant_moe_mma.cu): tests, then auto vs legacy
  stamp moe
  timeout -s INT "${TEST_TIMEOUT:-110}" python3 -m pytest -q -p no:cacheprovider -x \
    plugins/atlas-cuda/tests/test_quant_moe_mma_cuda.py plugins/atlas-cuda/tests/test_quant_moe_host.py \
    "plugins/atlas-cuda/tests/test_quant_cuda.py::test_moe_experts" \
    "plugins/atlas-cuda/tests/test_quant_cuda.py::test_moe_block_with_a_quantized_shared_expert" \
    2>&1 | tee "$OUT/moe-tests.log" | grep -E "passed|failed|error|FAILED|ERROR|assert" | tail -30
  for model in qwen3.5-35b-a3b-nvfp4 qwen3-30b-a3b-fp8; do
    for policy in auto legacy; do  # legacy: the older MoE kernels and the older dense linears
      ATLAS_CUDA_QUANT_KERNEL=$policy bench "moe-$model-$policy" "${MOEBENCH_TIMEOUT:-100}" \
        --model "$model" --batch 1,8 --context 1024 --decode-tokens 24 --copy-mb 1024 \
        --gpu-memory-utilization 0.6
    done
  done
fi
if has kvfp4; then
  stamp kvfp4
  timeout -s INT "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider \
    plugins/atlas-cuda/tests/test_kv_nvfp4_cuda.py plugins/atlas-cuda/tests/test_kv_nvfp4_host.py \
    2>&1 | tee "$OUT/kvfp4-tests.log" | grep -E "passed|failed|error|FAILED|ERROR" | tail -40
  timeout -s INT "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider \
    plugins/atlas-cuda/tests/test_contract_cuda.py -k "cache_nvfp4 or attention_nvfp4" \
    2>&1 | tee "$OUT/kvfp4-contract.log" | grep -E "passed|failed|error|FAILED|ERROR" | tail -40
fi
if has kvbench; then
  for kv in bf16 nvfp4; do
    bench "kv-$kv" "${KVBENCH_TIMEOUT:-240}" --model qwen3-8b \
      --concurrency "${KV_CONCURRENCY:-1,4}" --prompt-len 32768 --decode-tokens "${DECODE_TOKENS:-64}" --copy-mb 2048 \
      --kv-cache-dtype "$kv" --gpu-memory-utilization 0.85
  done
fi
stamp done
