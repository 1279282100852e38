#!/usr/bin/env bash
# Batch-1 decode tok/s of bench shapes under environment switches, one device call
# (docs/benchmarks.md). Each argument is "tag|model|VAR=value VAR=value" (empty env: defaults):
#   scripts/ab_decode.sh "35b|qwen3.5-35b-a3b|" "30b-fused|qwen3-30b-a3b|ATLAS_CUDA_MOE_FUSED=1"
# Install as gpu_check.sh does (wheels from ./.whl); env: PROMPT (128), DECODE (128), REPEAT (1),
# BENCH_TIMEOUT (60 s per run), UTIL (--gpu-memory-utilization: 0.85, qwen3.5 shapes 0.6; the 8B
# with a 4,096-token prompt needed 0.6 before the layer scope, session 11). Logs in $OUT
# (default ./ab_out).
set -uo pipefail
OUT=${OUT:-$PWD/ab_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
if [[ -z "${AB_NO_INSTALL:-}" ]]; then
  OUT=$OUT/gpu_check scripts/gpu_check.sh install >"$OUT/install_step.txt" 2>&1 \
    || { cat "$OUT/install_step.txt"; exit 1; }
fi
[[ -d /tmp/site ]] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
for r in $(seq "${REPEAT:-1}"); do
  for spec in "$@"; do
    IFS='|' read -r tag model envs <<<"$spec"
    util=0.85; [[ $model == qwen3.5-* ]] && util=0.6
    util=${UTIL:-$util}
    log="$OUT/bench-$tag-$r.log"
    env $envs timeout -s ABRT "${BENCH_TIMEOUT:-60}" python3 -m atlas_core bench --model "$model" \
      --backend cuda --concurrency 1 --prompt-len "${PROMPT:-128}" --decode-tokens "${DECODE:-128}" \
      --copy-mb 1024 --baseline none --gpu-memory-utilization "$util" >"$log" 2>&1
    echo "$tag [$envs] run $r: $(grep -E '^ +1 \|' "$log" || tail -2 "$log")"
  done
done
