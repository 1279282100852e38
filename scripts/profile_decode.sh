#!/usr/bin/env bash
# ncu per-kernel profile of one decode graph replay per named shape (scripts/decode_profile.py);
# env BATCH (1) sequences, CONTEXT (128) prompt tokens.
#   scripts/profile_decode.sh qwen3-8b qwen3-30b-a3b ...   (logs and summaries under $OUT)
set -uo pipefail
OUT=${OUT:-$PWD/profile_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
NCU=${NCU:-ncu}
for m in "$@"; do
  timeout -s INT ${PROFILE_TIMEOUT:-150} $NCU --profile-from-start off --graph-profiling node \
    --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
    python3 scripts/decode_profile.py "$m" --batch ${BATCH:-1} --context ${CONTEXT:-128} >"$OUT/prof-$m.csv" 2>"$OUT/prof-$m.err"
  ms=$(grep -oP 'graph replay \K[0-9.]+' "$OUT/prof-$m.err" | head -1)
  layers=$(grep -oP 'ms median of [0-9]+, \K[0-9]+' "$OUT/prof-$m.err" | head -1)
  echo "== $m (graph ${ms:-?} ms, ${layers:-?} layers)"
  python3 scripts/decode_profile.py --summarize "$OUT/prof-$m.csv" ${ms:+--graph-ms $ms} \
    ${layers:+--layers $layers} --first ${FIRST:-24} | tee "$OUT/summary-$m.txt" | head -${LINES_SHOWN:-60}
done
