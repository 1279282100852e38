#!/usr/bin/env bash
# One device call (one H200) for what session 23 wrote after its device time ran out, checks
# first, then the A/Bs that decide the defaults:
#   1. install (.whl wheels with nvmath-python: cuBLASLt; editable packages)
#   2. GPU tests: the tuned cuBLASLt linear (policy gemm_tune: the timed winner = reference, a
#      graph captured after it replays it) and every cuBLASLt linear case; Gemma-4 (greedy cuda =
#      numpy with the per-expert scale folded into down_proj on the device at load, contract cases)
#   3. qwen3-8b batches 1-32 at 1,024 tokens with ATLAS_CUDA_GEMM_TUNE=0 and =1 (session 23:
#      4.39 / 5.14 / 5.23 / 5.72 / 6.03 / 6.48 ms; make it the default only if it wins every
#      cell), and 8,192 at batches 2 / 8 both ways; gemma-4-26b-a4b batches 1 / 8 / 32 (session
#      23: 3.11 / 10.16 / 24.99 ms before the fold) and batch 1 with gemm_tune=1
#   4. the gemma-4-26b-a4b decode timeline (what is left of the 3.1 ms step)
# Run with carry [".whl", "dev"] as the command itself (no `| tail`). At most 8 files come back:
# everything goes to $OUT/session.log (also stdout), step logs to $OUT/logs.tgz and bench JSONs
# to $OUT/json.tgz, both rewritten as each step ends.
set -uo pipefail
OUT=${OUT:-$PWD/s24_out}
LOGS=/tmp/s24_logs
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
  >"$LOGS/install.log" 2>&1 || { tail "$LOGS/install.log"; exit 1; }
el installed
tests() {  # TAG SECONDS PYTEST-ARGS...
  local tag=$1 secs=$2; shift 2
  timeout -s INT "$secs" python3 -m pytest -q -m gpu -p no:cacheprovider -rf "$@" \
    >"$LOGS/tests-$tag.log" 2>&1
  el "tests $tag: $(tail -1 "$LOGS/tests-$tag.log")"
  grep -E "^FAILED|^ERROR|Interrupt" "$LOGS/tests-$tag.log" | head -12
  pack
}
tests gemm 90 plugins/atlas-cuda/tests/test_fast_paths_cuda.py -k "linear"
tests gemma 150 plugins/atlas-gemma4/tests/test_gemma4_cuda.py -k "greedy or contract or ffn_in"
bench() {  # TAG SECONDS SHAPE BATCHES CONTEXTS [ENV=VALUE ...]
  local tag=$1 secs=$2 shape=$3 batches=$4 contexts=$5; shift 5
  env "$@" timeout -s INT "$secs" python3 -m atlas_core bench --model "$shape" --backend cuda \
    --batch "$batches" --context "$contexts" --decode-tokens 32 --max-prefill-tokens 2048 \
    --gpu-memory-utilization 0.9 --json "$LOGS/json/$tag.json" >"$LOGS/bench-$tag.log" 2>&1
  el "$tag: exit $?"
  grep -E "^ +[0-9]+ \| +[0-9]+ \| +[0-9.]+ \| +[0-9,.]+ \||failed|rror|gemm_tune" \
    "$LOGS/bench-$tag.log" | head -12
  pack
}
bench qwen8b-1k 90 qwen3-8b 1,2,4,8,16,32 1024
bench qwen8b-1k-tuned 120 qwen3-8b 1,2,4,8,16,32 1024 ATLAS_CUDA_GEMM_TUNE=1
bench qwen8b-8k 90 qwen3-8b 2,8 8192
bench qwen8b-8k-tuned 120 qwen3-8b 2,8 8192 ATLAS_CUDA_GEMM_TUNE=1
bench gemma26 60 gemma-4-26b-a4b 1,8,32 1024
bench gemma26-tuned 60 gemma-4-26b-a4b 1,8,32 1024 ATLAS_CUDA_GEMM_TUNE=1
timeout 90 python3 scripts/decode_timeline.py gemma-4-26b-a4b --prompt 1024 --batch 1 --show 0 \
  >"$LOGS/timeline-gemma26.log" 2>&1
el "timeline: exit $?"; head -24 "$LOGS/timeline-gemma26.log"
pack
el done
