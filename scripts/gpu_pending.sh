#!/usr/bin/env bash
# One or two device calls (one GPU) for the work of session 21 that
# was written after its device time ran out: each step checks, then measures.
#   1. install: the wheels of scripts/fetch_device_wheels.sh (.whl, nvmath-python included, so
#      cuBLASLt is the baseline) and the editable packages
#   2. GPU tests: qskinny_dense / qskinny2_dense (test_dense_skinny_cuda.py), the new
#      qk_norm_rope_and_cache options and the PDL'd elementwise kernels (contract cases), the
#      Gemma-4 prologue through core ops and the fused MLP norm (Gemma-4 GPU tests), MiniMax
#   3. scripts/dense_skinny_bench.py: qwen3-8b's projections, 1-32 rows, cuBLASLt / mma / every
#      dense skinny form (the "dense" entries of ops_quant.SKINNY_DEPTH / SKINNY2_CONFIG)
#   4. atlas bench qwen3-8b at 1,024 tokens, batches 1-32, default against ATLAS_CUDA_GEMM=skinny
#      (the #21 matrix cells that are under 75%)
#   5. atlas bench gemma-4-26b-a4b (batches 1, 8, 32) and gemma-4-31b (batch 1) at 1,024 tokens:
#      against session 21's 5.40 / 18.90 / 36.23 and 20.75 ms (docs/benchmarks.md)
#   6. Nemotron: the fused router's GPU tests, nemotron-3-nano batch 1 / 8 with it and without
#   7. (`gpu_pending.sh 3`, a call of its own) the whole qwen3-8b matrix before / after the PDL
#      change to the core small kernels, beside the compiled-PyTorch baseline
# About 15 minutes in all on a fresh machine, more than one call may take: `gpu_pending.sh 1`
# runs steps 1-4 (the core: dense skinny, contract cases, qwen3-8b), `gpu_pending.sh 2` steps 1
# and 5-6 plus the family GPU tests (Gemma-4, MiniMax, Nemotron); no argument runs both.
# Run with carry [".whl"] and, for the chat-template tests, the fixtures:
#   mkdir -p dev/real-models && cp -r ../shared/fixtures/real-models/{gemma-3,gemma-4,minimax-m2,nemotron} \
#     dev/real-models/   (dev/ in .git/info/exclude; carry "dev" too)
# The 2-GPU half (the ll all-reduce) is plugins/atlas-nccl/tests/gpu_session.sh with
# ATLAS_P2P_ALLREDUCE_MODE=ll beside push, and scripts/allreduce_bench.py -n 2.
set -uo pipefail
OUT=${OUT:-$PWD/pending_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
[[ -d dev/real-models ]] && export ATLAS_FIXTURES_DIR=$PWD/dev/real-models
T0=$SECONDS
el() { echo "[+$((SECONDS - T0))s] $*"; }
if [[ -d .whl ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >"$OUT/wheels.log" 2>&1 || tail -3 "$OUT/wheels.log"
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/atlas-cuda \
  -e plugins/atlas-hopper -e plugins/atlas-qwen3 -e plugins/atlas-gemma4 -e plugins/atlas-minimax \
  >"$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
python3 -c "from nvmath.bindings import cublasLt as l; print('cuBLASLt', l.get_version())" 2>&1 | tail -1
el installed

part=${1:-all}
core() { [[ $part == all || $part == 1 ]]; }
families() { [[ $part == all || $part == 2 ]]; }
matrix() { [[ $part == 3 ]]; }
bench() {  # TAG SECONDS SHAPE BATCHES [ENV=VALUE] [CONTEXTS] [more bench flags]
  local log="$OUT/bench-$1"
  env ${5:-} timeout -s INT "$2" python3 -m atlas_core bench --model "$3" --backend cuda \
    --batch "$4" --context "${6:-1024}" --decode-tokens 32 --max-prefill-tokens 2048 \
    --gpu-memory-utilization 0.9 --json "$log.json" ${7:-} >"$log.log" 2>&1
  el "$1: exit $?"
  grep -E "^ +[0-9]+ \| +[0-9]+ \| +[0-9.]+ \| +[0-9,.]+ \||matmuls|error|failed" "$log.log" \
    | head -40
}
if core; then
  timeout -s INT 240 python3 -m pytest -q -m gpu -p no:cacheprovider \
    plugins/atlas-cuda/tests/test_dense_skinny_cuda.py \
    plugins/atlas-cuda/tests/test_contract_cuda.py \
    -k "dense_skinny or qk_norm_rope or rms_norm or embedding or add or act_and_mul or rope_cache" \
    >"$OUT/tests-core.log" 2>&1
  el "core GPU tests: $(tail -1 "$OUT/tests-core.log")"

  timeout -s INT 120 python3 scripts/dense_skinny_bench.py >"$OUT/dense_skinny_bench.log" 2>&1
  el "dense skinny bench: exit $?"; cat "$OUT/dense_skinny_bench.log" | tail -32

  bench 8b-default 60 qwen3-8b 1,2,4,8,16,32
  bench 8b-skinny 60 qwen3-8b 1,2,4,8,16,32 ATLAS_CUDA_GEMM=skinny
fi
if families; then
  timeout -s INT 150 python3 -m pytest -q -m gpu -p no:cacheprovider plugins/atlas-gemma4/tests \
    plugins/atlas-minimax/tests >"$OUT/tests-families.log" 2>&1
  el "Gemma-4 / MiniMax GPU tests: $(tail -1 "$OUT/tests-families.log")"
  bench gemma26 45 gemma-4-26b-a4b 1,8,32
  bench gemma31 45 gemma-4-31b 1
  # 6. Nemotron's one-kernel router: its GPU tests, then batch 1 / 8 at 1,024 tokens against the
  #    two kernels (session 20: 2.67 ms = 57.8% at batch 1; the #23 target is 60%)
  python3 -m pip install -q --no-deps --no-build-isolation -e plugins/atlas-nemotron-h \
    >>"$OUT/install.log" 2>&1
  timeout -s INT 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
    plugins/atlas-nemotron-h/tests/test_nemotron_h_cuda.py >"$OUT/tests-nemotron.log" 2>&1
  el "Nemotron GPU tests: $(tail -1 "$OUT/tests-nemotron.log")"
  bench nemotron-two 60 nemotron-3-nano-30b-a3b 1,8 ATLAS_NEMOTRON_ROUTE=two
  bench nemotron-fused 60 nemotron-3-nano-30b-a3b 1,8 ATLAS_NEMOTRON_ROUTE=fused
fi
if matrix; then
  # 7. The whole qwen3-8b matrix (batches 1-32 x 1k / 8k / 32k, decode at that context) with
  #    the session's kernel changes against the commit before them (bench_base: `git archive
  #    82eb737 | tar -x -C bench_base`, carried; reinstalled editable as scripts/ab_trees.sh
  #    does), beside the compiled-PyTorch baseline, in this one call.
  bench 8b-matrix-new 280 qwen3-8b 1,2,4,8,16,32 "" 1024,8192,32768 "--baseline compiled"
  if [[ -d bench_base ]]; then
    (cd bench_base && python3 -m pip install -q --no-deps --no-build-isolation -e . \
      -e plugins/atlas-cuda -e plugins/atlas-hopper -e plugins/atlas-qwen3) >>"$OUT/install.log" 2>&1
    (cd bench_base && bench 8b-matrix-base 200 qwen3-8b 1,2,4,8,16,32 "" 1024,8192,32768)
  fi
fi
el done
