#!/usr/bin/env bash
# Quantized decode MoE experts on the tensor cores (issue #22, quant_moe_mma.cu) in one device
# call, under 8 minutes on an H200 / H100:
#   scripts/quant_moe_check.sh [tests|bench|all]...   (default: all)
# tests: plugins/atlas-cuda/tests/test_quant_moe_mma_cuda.py (the new kernels against NumPy:
#        FP8 block / channel, NVFP4; 1-8 tokens; top-1/2/8; 8 and 128 experts; bf16 / f16; the
#        fallback shape; legacy vs auto on the same inputs), the MoE cases of test_quant_cuda.py
#        and the host tests of the routing (TEST_TIMEOUT, default 110 s).
# bench: atlas bench qwen3.5-35b-a3b-nvfp4 and qwen3-30b-a3b-fp8 at batch 1 and 8, 1024 tokens
#        of context, 24 decode tokens, each with the default kernels and with
#        ATLAS_CUDA_QUANT_KERNEL=legacy (the older warp-per-column MoE kernels and GEMVs): an
#        A/B on one machine (limits: FIRST_TIMEOUT for a model's first run, which builds the
#        NVRTC cache, default 95 s; BENCH_TIMEOUT for the second, 65 s). The last lines print
#        step ms and % of the floor per run.
# Worst case (every limit hit): ~30 s install + 110 + 2 x (95 + 65) = 460 s.
# Logs and bench JSON go to $OUT (or ./quant_moe_check_out).
set -uo pipefail
OUT=${OUT:-$PWD/quant_moe_check_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATLAS_CUDA_QUANT_WEIGHTS=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
steps=${*:-all}
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

if has tests; then
  stamp tests
  timeout -s INT "${TEST_TIMEOUT:-110}" python3 -m pytest -q -p no:cacheprovider -x \
    plugins/atlas-cuda/tests/test_quant_moe_mma_cuda.py plugins/atlas-cuda/tests/test_quant_moe_host.py \
    "plugins/atlas-cuda/tests/test_quant_cuda.py::test_moe_experts" \
    "plugins/atlas-cuda/tests/test_quant_cuda.py::test_moe_block_with_a_quantized_shared_expert" \
    2>&1 | tee "$OUT/tests.log" | grep -E "passed|failed|error|FAILED|ERROR|assert" | tail -30
fi
bench() {  # name kernel-policy model memory-fraction limit
  stamp "bench $1"
  ATLAS_CUDA_QUANT_KERNEL=$2 timeout -s ABRT "$5" python3 -X faulthandler \
    -m atlas_core bench --model "$3" --batch 1,8 --context 1024 --decode-tokens 24 \
    --copy-mb 1024 --gpu-memory-utilization "$4" --json "$OUT/bench-$1.json" \
    >"$OUT/bench-$1.log" 2>&1 || echo "bench $1 failed or timed out: $(tail -3 "$OUT/bench-$1.log")"
}
if has bench; then
  first=${FIRST_TIMEOUT:-95} second=${BENCH_TIMEOUT:-65}
  bench 35b-nvfp4-auto auto qwen3.5-35b-a3b-nvfp4 0.6 "$first"
  bench 35b-nvfp4-legacy legacy qwen3.5-35b-a3b-nvfp4 0.6 "$second"
  bench 30b-fp8-auto auto qwen3-30b-a3b-fp8 0.85 "$first"
  bench 30b-fp8-legacy legacy qwen3-30b-a3b-fp8 0.85 "$second"
  python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
for f in sorted(Path(sys.argv[1]).glob("bench-*.json")):
    for c in json.loads(f.read_text()).get("cells", []):
        print(f"{f.stem[6:]:20s} batch {c['batch']:>2} ctx {c['context']}: "
              f"{c.get('status')} step {c.get('step_ms') or 0:.2f} ms, "
              f"{c.get('pct_floor') or 0:.1f}% of floor")
EOF
fi
stamp done
