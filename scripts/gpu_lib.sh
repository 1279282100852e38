# Shared by the per-session device scripts (scripts/gpu_session*.sh), sourced after they set
# OUT (what comes back from the device), LOGS (step logs, JSONs under $LOGS/json) and PLUGINS
# (the plugin folders to install): the session log teed to $OUT/session.log, the wheels of
# .whl/ (carried) on PYTHONPATH, an editable install, and the step helpers
#   tests TAG SECONDS PYTEST-ARGS...              GPU tests, the summary line and failures
#   bench TAG SECONDS SHAPE BATCHES CONTEXTS [ARGS...]   atlas bench, its rows
# each repacking $OUT/logs.tgz and $OUT/json.tgz as it ends (at most 8 files come back).
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
# shellcheck disable=SC2086  # PLUGINS is a list of folders
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- '-e plugins/%s ' $PLUGINS) \
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
bench() {  # TAG SECONDS SHAPE BATCHES CONTEXTS [EXTRA-ARGS...]
  local tag=$1 secs=$2 shape=$3 batches=$4 contexts=$5; shift 5
  timeout -s INT "$secs" python3 -m atlas_core bench --model "$shape" --backend cuda \
    --batch "$batches" --context "$contexts" --decode-tokens 32 --max-prefill-tokens 4096 \
    --gpu-memory-utilization 0.9 --json "$LOGS/json/$tag.json" "$@" >"$LOGS/bench-$tag.log" 2>&1
  el "$tag: exit $?"
  grep -E "^ +[0-9]+ \| +[0-9]+ \||failed|rror|baseline|x hf" "$LOGS/bench-$tag.log" | head -16
  pack
}
