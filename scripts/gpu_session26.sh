#!/usr/bin/env bash
# What session 25 left for a GPU (numbers go to docs/benchmarks.md), checks first, then timings:
#   part a (one H200): batch 1's decode graphs over narrower block tables (new, mock-tested
#           only): their GPU test (tokens = the full-width graph's, overlap on and off), the
#           async-scheduling tests, then each A/B in one run with 1k and 32k cells (decode graph
#           tables 33k wide, as a server whose longest sequence is 32k builds them): default
#           against ATLAS_DECODE_GRAPH_WIDTHS=0, qwen3-8b, qwen3-14b (groups of 5: CUDA-core at
#           batch 1 up to 4k of table), gemma-4-31b (its 512-wide plan at 1k: 17.90 against
#           17.67 ms in session 24)
#   parts c1 / c2 (one H200): the tensor-core decode attention with its partials merged by a kernel
#           of their own (ATLAS_CUDA_DECODE_MERGE=kernel, written in session 25 without a GPU):
#           c1 its GPU tests, the per-op benches (attn_decode_bench.py --merge at 64-256,
#           --gemma-full at 512: plan, forced heads, merge kernel, swa_split); c2 whole steps
#           both ways: gemma-4-26b-a4b batch 1 at 1k / 32k, gemma-4-31b, qwen3-30b-a3b and
#           nemotron-3-nano-30b-a3b batch 1 at 32k (make it the default only if it wins every
#           row, per head dim)
#   part d (one H200): Nemotron-H's GPU tests of session 25's fixes (experts kept FP8 / NVFP4,
#           n-gram speculation on Mamba-2 state rows, greedy), then nemotron-3-nano-30b-a3b
#           batch 1 / 8 / 32 at 1k beside HF eager, and at 32k (batch 32 at 32k never ran: a
#           million-token prefill)
#   part b (2 x H200): the peer-memory all-reduce's `ll` protocol (written in session 21, never
#           run) and all-to-all-v (session 25): the two-GPU collectives test (every protocol bit
#           for bit, eager and in graphs), then allreduce_bench.py
# Run with carry [".whl", "dev"] as the command itself (no `| tail`); the logs and JSONs come
# back as scripts/gpu_lib.sh says.
set -uo pipefail
part=${1:?usage: gpu_session26.sh a|b|c1|c2|d}
OUT=${OUT:-$PWD/s26_out}
LOGS=/tmp/s26_logs
PLUGINS="atlas-cuda atlas-hopper atlas-qwen3 atlas-qwen35 atlas-gemma4 atlas-nemotron-h atlas-nccl"
# shellcheck source=scripts/gpu_lib.sh
source scripts/gpu_lib.sh
case $part in
a)
  tests narrow 120 plugins/atlas-cuda/tests/test_narrow_graphs_cuda.py \
    plugins/atlas-cuda/tests/test_async_scheduling_cuda.py
  for shape in qwen3-8b qwen3-14b gemma-4-31b; do
    bench "$shape-narrow" 120 "$shape" 1 1024,32768
    ATLAS_DECODE_GRAPH_WIDTHS=0 bench "$shape-wide" 120 "$shape" 1 1024,32768
  done
  ;;
c1)
  tests merge 200 plugins/atlas-cuda/tests/test_decode_attention_mma_cuda.py -k "merge or 512"
  timeout 90 python3 scripts/attn_decode_bench.py --merge >"$LOGS/merge.log" 2>&1
  el "merge: exit $?"; grep "|" "$LOGS/merge.log"; pack
  timeout 150 python3 scripts/attn_decode_bench.py --gemma-full >"$LOGS/gemma-full.log" 2>&1
  el "gemma full: exit $?"; grep "|" "$LOGS/gemma-full.log"; pack
  ;;
c2)
  for cell in "gemma-4-26b-a4b 1024,32768" "gemma-4-31b 32768" "qwen3-30b-a3b 32768" \
              "nemotron-3-nano-30b-a3b 32768"; do
    set -- $cell
    bench "${1}-block" 100 "$1" 1 "$2"
    ATLAS_CUDA_DECODE_MERGE=kernel bench "${1}-kernel" 100 "$1" 1 "$2"
  done
  ;;
d)
  tests nemotron 200 plugins/atlas-nemotron-h/tests/test_nemotron_h_cuda.py \
    -k "quantized or speculation or greedy"
  bench nem-1k 240 nemotron-3-nano-30b-a3b 1,8,32 1024 --baseline hf --baseline-decode-tokens 8
  bench nem-32k 330 nemotron-3-nano-30b-a3b 1,8,32 32768
  ;;
b)
  # pull / push / ll bit for bit, eager and in graphs, and all-to-all-v (session 25)
  tests collectives 240 plugins/atlas-nccl/tests/test_parallel_cuda.py -k "collectives"
  timeout 200 python3 scripts/allreduce_bench.py -n 2 >"$LOGS/allreduce.log" 2>&1
  el "allreduce bench: exit $?"; grep "|" "$LOGS/allreduce.log"; pack
  ;;
*) echo "part a, b, c1, c2 or d"; exit 2 ;;
esac
el done
