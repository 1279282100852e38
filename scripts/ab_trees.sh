#!/usr/bin/env bash
# Decode tok/s of bench shapes on two source trees in one device call (a refactor's "no speed
# change" check, docs/benchmarks.md). The other tree is a plain copy of an earlier commit, made
# here with `git archive <commit> | tar -x -C bench_base` and carried (name it in .git/info/exclude):
#   scripts/ab_trees.sh bench_base . -- qwen3-8b qwen3-0.6b qwen3-30b-a3b qwen3.5-35b-a3b
# Each tree is installed (editable, no deps) before its runs; trees alternate REPEAT times.
# Trees from before 2026-11-27 decode after 128-token prompts whatever --prompt-len says, newer
# ones at --prompt-len: keep PROMPT at 128 when one side is that old, so both decode at ~128.
# env: CONC (1,32), PROMPT (128), DECODE (64), BENCH_TIMEOUT (150 s a run). Logs in $OUT.
set -uo pipefail
OUT=${OUT:-$PWD/ab_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
trees=()
while [[ $# -gt 0 && $1 != "--" ]]; do trees+=("$1"); shift; done
shift
models=("$@")
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  >"$OUT/wheels.log" 2>&1 || tail -3 "$OUT/wheels.log"
OUT=$OUT/gpu_check scripts/gpu_check.sh install >"$OUT/install_step.txt" 2>&1 \
  || { cat "$OUT/install_step.txt"; exit 1; }
[[ -d /tmp/site ]] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
for r in $(seq "${REPEAT:-1}"); do
  for tree in "${trees[@]}"; do
    tag=$(basename "$(cd "$tree" && pwd)")
    (cd "$tree" && python3 -m pip install -q --no-deps --no-build-isolation -e . \
      -e plugins/atlas-qwen3 -e plugins/atlas-cuda -e plugins/atlas-hopper -e plugins/atlas-qwen35) \
      >>"$OUT/install-$tag.log" 2>&1 || { echo "install of $tree failed"; tail "$OUT/install-$tag.log"; }
    for model in "${models[@]}"; do
      util=0.85; [[ $model == qwen3.5-* ]] && util=0.6
      log="$OUT/bench-$tag-$model-$r.log"
      (cd "$tree" && timeout -s ABRT "${BENCH_TIMEOUT:-150}" python3 -m atlas_core bench \
        --model "$model" --backend cuda --concurrency "${CONC:-1,32}" --prompt-len "${PROMPT:-128}" \
        --decode-tokens "${DECODE:-64}" --copy-mb 1024 --baseline none \
        --gpu-memory-utilization "$util") >"$log" 2>&1
      echo "== $tag $model run $r"; grep -E '^ +[0-9]+ \|' "$log" || tail -3 "$log"
    done
  done
done
