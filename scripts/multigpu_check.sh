#!/usr/bin/env bash
# Multi-GPU checks for the coordinator on a 2-GPU machine (nvidia-h100-x2 / nvidia-h200-x2):
# the parallel ops' kernels and NCCL (eager and in a CUDA graph), TP=2 / EP=2 engines against
# one GPU on tiny checkpoints, all-reduce time per decode step, then the qwen3-8b shape (random
# weights written once to the cache dir, 16 GB): teacher-forced logprobs at TP=2 against one
# GPU, and batch-1 decode at TP=1 and TP=2. Every line has a timeout; they add up to 8 minutes.
#
# nccl4py is not on the lent machines: carry it as a wheel (see the device README), e.g. here
#   echo /.whl/ >> .git/info/exclude && python3 -m pip download --no-deps --only-binary=:all: \
#     --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d .whl nccl4py==0.6.0
# (plus cuda-pathfinder if missing there; libnccl comes with PyTorch's nvidia-nccl-cu13) and
# name .whl in carry. NVLink multicast stays off: the lent machines must keep NCCL_NVLS_ENABLE=0.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ATLAS_LOG_LEVEL=${ATLAS_LOG_LEVEL:-WARNING} ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
PY=${PY:-python3}
if [[ -d .whl ]]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
status=0
step() { echo "== $*"; "$@" || status=1; }

step timeout 60 $PY -m pip install -q --no-deps --no-build-isolation -e . -e plugins/atlas-qwen3 \
    -e plugins/atlas-cuda -e plugins/atlas-hopper -e plugins/atlas-nccl
step timeout 10 nvidia-smi --query-gpu=index,name,memory.total --format=csv
step timeout 140 $PY -m pytest -q -p no:cacheprovider -m gpu plugins/atlas-nccl/tests/test_parallel_cuda.py
step timeout 50 $PY scripts/allreduce_bench.py -n 2 --hidden 4096 --layers 36
step timeout 110 $PY scripts/multigpu_compare.py --shape qwen3-8b -tp 2 --tokens 8
step timeout 50 $PY -m atlas_core bench --model qwen3-8b --on-disk --batch 1 --context 512 \
    --decode-tokens 64 --json /tmp/atlas-tp1.json
step timeout 60 $PY -m atlas_core bench --model qwen3-8b -tp 2 --batch 1 --context 512 \
    --decode-tokens 64 --json /tmp/atlas-tp2.json
$PY - <<'PY' || status=1
import json
one, two = (json.load(open(f"/tmp/atlas-tp{n}.json")) for n in (1, 2))
tok = lambda r: [c for c in r["cells"] if c.get("tok_s")][0]["tok_s"]
print(f"qwen3-8b batch 1: TP=1 {tok(one):.1f} tok/s, TP=2 {tok(two):.1f} tok/s, "
      f"speed-up {tok(two) / tok(one):.2f}x (target >= 1.6x)")
PY
exit $status
