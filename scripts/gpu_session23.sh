#!/usr/bin/env bash
# One device call (one H200) for session 23's decode work, checks first, then the benches:
#   1. install (.whl wheels with nvmath-python, so cuBLASLt is the baseline; editable packages)
#   2. GPU tests, in groups with their own limits (one slow group cannot starve the next):
#      the one-token MoE down kernels incl. moe_dec_down_rows (now auto's choice) and
#      rope_vec.cu (now auto's at head dims 256 / 512), both unchecked on a GPU until now; the
#      tensor-core decode kernel (its new window argument); Gemma-4 (window decode on that
#      kernel, the fused ffn_in prologue, the contract cases, greedy cuda = numpy)
#   3. benches at 1,024 tokens unless named: gemma-4-26b-a4b batches 1 / 8 / 32 (session 23
#      call 1: 3.68 / 10.51 / 24.13 ms) and its A/Bs at batch 1 (each one default reverted:
#      the window decode on attn_dec_swa, the composed ffn_in, the old MoE down and rope
#      kernels), gemma-4-31b, minimax-m2, qwen3.5-35b-a3b with moe_down=rows now auto against
#      the wide kernel (its old auto), qwen3-8b batches 1 / 8 (the mma kernel's new argument)
#   4. attn_decode_bench.py --mma-splits (the tensor-core kernel under forced split counts at
#      batches 1-32; window decode mma against swa)
# Run with carry [".whl", "dev"] as the command itself (no `| tail`). At most 8 files come back:
# everything goes to $OUT/session.log (also stdout), step logs to $OUT/logs.tgz and bench JSONs
# to $OUT/json.tgz, both rewritten as each step ends.
set -uo pipefail
OUT=${OUT:-$PWD/s23_out}
LOGS=/tmp/s23_logs
mkdir -p "$OUT" "$LOGS/json"
exec > >(tee -a "$OUT/session.log") 2>&1
pack() { tar czf "$OUT/logs.tgz" -C "$LOGS" --exclude json . 2>/dev/null
         tar czf "$OUT/json.tgz" -C "$LOGS/json" . 2>/dev/null; }
export PYTHONUNBUFFERED=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
[[ -d dev/real-models ]] && export ATLAS_FIXTURES_DIR=$PWD/dev/real-models
T0=$SECONDS
el() { echo "[+$((SECONDS - T0))s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >"$LOGS/wheels.log" 2>&1 || tail -3 "$LOGS/wheels.log"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/atlas-cuda \
  -e plugins/atlas-hopper -e plugins/atlas-qwen3 -e plugins/atlas-qwen35 \
  -e plugins/atlas-gemma4 -e plugins/atlas-minimax >"$LOGS/install.log" 2>&1 \
  || { tail "$LOGS/install.log"; exit 1; }
el installed
tests() {  # TAG SECONDS PYTEST-ARGS...
  local tag=$1 secs=$2; shift 2
  timeout -s INT "$secs" python3 -m pytest -q -m gpu -p no:cacheprovider -rf "$@" \
    >"$LOGS/tests-$tag.log" 2>&1
  el "tests $tag: $(tail -1 "$LOGS/tests-$tag.log")"
  grep -E "^FAILED|^ERROR|Interrupt" "$LOGS/tests-$tag.log" | head -12
  pack
}
tests down-rope 150 plugins/atlas-cuda/tests/test_rope_vec_cuda.py \
  plugins/atlas-cuda/tests/test_moe_cuda.py -k "rope_vec or rotary or one_token_down"
tests mma 90 plugins/atlas-cuda/tests/test_decode_attention_mma_cuda.py
tests gemma 150 plugins/atlas-gemma4/tests/test_gemma4_cuda.py \
  -k "every_kernel or ffn_in or greedy"
bench() {  # TAG SECONDS SHAPE BATCHES CONTEXTS [ENV=VALUE ...]
  local tag=$1 secs=$2 shape=$3 batches=$4 contexts=$5; shift 5
  env "$@" timeout -s INT "$secs" python3 -m atlas_core bench --model "$shape" --backend cuda \
    --batch "$batches" --context "$contexts" --decode-tokens 32 --max-prefill-tokens 2048 \
    --gpu-memory-utilization 0.9 --json "$LOGS/json/$tag.json" >"$LOGS/bench-$tag.log" 2>&1
  el "$tag: exit $?"
  grep -E "^ +[0-9]+ \| +[0-9]+ \| +[0-9.]+ \| +[0-9,.]+ \||failed|rror" "$LOGS/bench-$tag.log" \
    | head -12
  pack
}
bench gemma26 60 gemma-4-26b-a4b 1,8,32 1024
bench gemma26-swa 40 gemma-4-26b-a4b 1 1024 ATLAS_CUDA_DECODE_PLAN=split
bench gemma26-composed 40 gemma-4-26b-a4b 1 1024 ATLAS_GEMMA_FFN_IN=composed
bench gemma26-old-down-rope 40 gemma-4-26b-a4b 1 1024 ATLAS_CUDA_MOE_DOWN=plain \
  ATLAS_CUDA_ROPE=generic
bench gemma31 45 gemma-4-31b 1 1024
bench minimax 40 minimax-m2 1 1024
bench qwen35b 50 qwen3.5-35b-a3b 1 1024
bench qwen35b-wide 40 qwen3.5-35b-a3b 1 1024 ATLAS_CUDA_MOE_DOWN=wide
bench qwen8b 40 qwen3-8b 1,8 1024
timeout 120 python3 scripts/attn_decode_bench.py --mma-splits >"$LOGS/mma-splits.log" 2>&1
el "mma splits: exit $?"; cat "$LOGS/mma-splits.log" | grep -E "\|" | head -20
pack
el done
