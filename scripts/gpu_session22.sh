#!/usr/bin/env bash
# One device call (one H200) for session 22's Gemma decode work, checks first, then the benches:
#   1. install (.whl wheels with nvmath-python, so cuBLASLt is the baseline; editable packages)
#   2. GPU tests: Gemma-4 (contract cases incl. ffn_out / mul_gathered / the d64 decode case,
#      every attention kernel at Gemma-4 shapes incl. the core's attn_dec_swa_*, cuda greedy =
#      numpy), the dense-skinny model test, the MoE decode tests
#   3. atlas bench gemma-4-26b-a4b batches 1 / 8 / 32 and gemma-4-31b batch 1 at 1,024 tokens
#      (session 22 before: 4.68 / 11.55 / 28.84 and 18.77 ms), then batch 1 at 32,768
#   4. A/Bs at batch 1: ATLAS_CUDA_MOE_DOWN=wide, ATLAS_GEMMA_DECODE_ATTENTION=own, and the
#      opt-in ATLAS_CUDA_MOE_DOWN=rows (h staged in shared memory) against the default on
#      gemma-4-26b-a4b, minimax-m2 and qwen3-30b-a3b (make it auto's choice where it wins all);
#      the opt-in ATLAS_CUDA_ROPE=vec (rope_vec.cu) on gemma-4-26b-a4b
#   5. the decode timeline of gemma-4-26b-a4b at batch 1 (where the step goes now), and ncu's
#      per-kernel times of qwen3-8b at batch 8, 1,024 tokens (cuBLASLt's kernels included, which
#      the timeline cannot trace): the #21 cells at 67-73% spend ~146 us a layer against a 98 us
#      floor, and the timeline put attention + o_proj at 29 us a layer against ~16 us of bytes
# Run with carry [".whl", "dev"] (dev/real-models: the chat-template fixtures), as the command
# itself (no `| tail`: a call cut at its limit loses a pipeline's output). What comes back: at
# most 8 files, so everything goes to $OUT/session.log (also stdout), the logs of each step to
# $OUT/logs.tgz and the bench JSONs to $OUT/json.tgz, both written as each step ends.
# Session 22 ran this at 2fc6bf9 and lost the tests' result (a `| tail` pipeline, cut at the
# session's last device second); the benches of that run are in docs/benchmarks.md.
set -uo pipefail
OUT=${OUT:-$PWD/s22_out}
LOGS=/tmp/s22_logs
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
  -e plugins/atlas-hopper -e plugins/atlas-qwen3 -e plugins/atlas-gemma4 \
  -e plugins/atlas-minimax >"$LOGS/install.log" 2>&1 || { tail "$LOGS/install.log"; exit 1; }
el installed
timeout -s INT 170 python3 -m pytest -q -m gpu -p no:cacheprovider plugins/atlas-gemma4/tests \
  plugins/atlas-cuda/tests/test_dense_skinny_cuda.py plugins/atlas-cuda/tests/test_moe_cuda.py \
  plugins/atlas-cuda/tests/test_rope_vec_cuda.py \
  -k "gemma or model_decodes or one_token_down or moe_experts_paths or rope_vec or rotary" \
  >"$LOGS/tests-gemma.log" 2>&1
el "GPU tests: $(tail -1 "$LOGS/tests-gemma.log")"
grep -E "^FAILED|Error" "$LOGS/tests-gemma.log" | head -12
pack
bench() {  # TAG SECONDS SHAPE BATCHES CONTEXTS [ENV=VALUE]
  local log="$LOGS/bench-$1"
  env ${6:-} timeout -s INT "$2" python3 -m atlas_core bench --model "$3" --backend cuda \
    --batch "$4" --context "$5" --decode-tokens 32 --max-prefill-tokens 2048 \
    --gpu-memory-utilization 0.9 --json "$LOGS/json/$1.json" >"$log.log" 2>&1
  el "$1: exit $?"
  grep -E "^ +[0-9]+ \| +[0-9]+ \| +[0-9.]+ \| +[0-9,.]+ \||failed|rror" "$log.log" | head -12
  pack
}
bench gemma26 60 gemma-4-26b-a4b 1,8,32 1024
bench gemma31 45 gemma-4-31b 1 1024
bench gemma26-down-wide 40 gemma-4-26b-a4b 1 1024 ATLAS_CUDA_MOE_DOWN=wide
bench gemma26-attn-own 40 gemma-4-26b-a4b 1 1024 ATLAS_GEMMA_DECODE_ATTENTION=own
bench gemma26-down-rows 40 gemma-4-26b-a4b 1 1024 ATLAS_CUDA_MOE_DOWN=rows
bench gemma26-rope-vec 40 gemma-4-26b-a4b 1 1024 ATLAS_CUDA_ROPE=vec
bench minimax 40 minimax-m2 1 1024
bench minimax-down-rows 40 minimax-m2 1 1024 ATLAS_CUDA_MOE_DOWN=rows
bench qwen30b 40 qwen3-30b-a3b 1 1024
bench qwen30b-down-rows 40 qwen3-30b-a3b 1 1024 ATLAS_CUDA_MOE_DOWN=rows
bench gemma31-32k 60 gemma-4-31b 1 32768
timeout 90 python3 scripts/decode_timeline.py gemma-4-26b-a4b --prompt 1024 --batch 1 --show 0 \
  >"$LOGS/timeline-gemma26.log" 2>&1
el "timeline: exit $?"; head -30 "$LOGS/timeline-gemma26.log"
pack
OUT=$LOGS BATCH=8 CONTEXT=1024 FIRST=20 PROFILE_TIMEOUT=120 bash scripts/profile_decode.sh qwen3-8b \
  >/dev/null 2>&1
el "qwen3-8b batch-8 profile: exit $?"; head -40 "$LOGS/summary-qwen3-8b.txt"
pack
el done
