#!/usr/bin/env bash
# The #21 qwen3-8b matrix beside the compiled-PyTorch baseline, in two device calls of one H200
# (one call cannot hold it: Atlas's 17 cells take ~200 s, the baseline compiles once a cell):
#   scripts/matrix_baseline.sh a   batches 1-32 at 1,024 and 8,192 tokens (12 cells)
#   scripts/matrix_baseline.sh b   batches 1-16 at 32,768 tokens (5 cells; 32 x 32k needs 146 GiB
#                                  of KV cache)
#   scripts/matrix_baseline.sh c   batches 1-32 at 1,024 tokens only (6 cells: a short call)
# Each call runs Atlas's cells and the baseline's in the same process run (`atlas bench
# --baseline compiled`), so every ratio it reports is within one call. Run as the command
# itself with carry [".whl"] (nvmath-python: cuBLASLt); stdout is also $OUT/session.log and the
# JSON is $OUT/matrix-<part>.json. Session 22 found a single call of all 17 cells spent 280 s in
# the baseline without finishing one cell's output (since e0b1efc the baseline's progress shows).
set -uo pipefail
part=${1:?usage: matrix_baseline.sh a|b|c}
case $part in
  a) batches=1,2,4,8,16,32; contexts=1024,8192 ;;
  b) batches=1,2,4,8,16; contexts=32768 ;;
  c) batches=1,2,4,8,16,32; contexts=1024 ;;
  *) echo "part a, b or c"; exit 2 ;;
esac
OUT=${OUT:-$PWD/matrix_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/session.log") 2>&1
export PYTHONUNBUFFERED=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/tmp/wheels.log 2>&1 || tail -3 /tmp/wheels.log
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/atlas-cuda \
  -e plugins/atlas-hopper -e plugins/atlas-qwen3 >/tmp/install.log 2>&1 \
  || { tail /tmp/install.log; exit 1; }
timeout -s INT ${MATRIX_TIMEOUT:-540} python3 -m atlas_core bench --model qwen3-8b --backend cuda \
  --batch "$batches" --context "$contexts" --decode-tokens 32 --max-prefill-tokens 2048 \
  --gpu-memory-utilization 0.9 --baseline compiled --baseline-timeout ${BASELINE_TIMEOUT:-420} \
  --json "$OUT/matrix-$part.json"
echo "exit $?"
