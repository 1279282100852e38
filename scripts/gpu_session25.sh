#!/usr/bin/env bash
# What session 24 left for a GPU, and session 25's odd-GQA-group decode kernels (one H200 a
# part; numbers go to docs/benchmarks.md), checks first, then timings:
#   part a1: GPU tests of what changed after session 24's last test run: CudaBackend.elapsed_ms
#           now destroys its two events (every graph-timing test goes through it), Nemotron-H
#           with the one-kernel router as the default (greedy cuda = numpy, router bit for bit),
#           the tensor-core decode kernels (the 512-wide one with its trigger moved; the new
#           whole-group tiles of 3 / 5 / 6 / 7 heads at head dim 128, MiniMax-M2 / Qwen3-14B /
#           Qwen2.5-7B), then the per-op bench of those groups under each decode plan
#           (attn_decode_bench.py --odd-groups), then swa_fa's GPU test (Gemma's prefill
#           attention with K/V through a cp.async ring, written without a GPU)
#   part a2: the prefill bench of swa_fa against swa_mma (scripts/gemma_prefill_bench.py), a
#           32k prompt's TTFT both ways (make swa_fa the default only if it passes and wins
#           every row), minimax-m2 at 1k / 32k, batch 1 / 32 (its 6-head groups now decode on
#           tensor cores past 512 tokens)
#   part b: gemma-4-26b-a4b batch 1 at 32,768 tokens beside HF eager, and batch 32 at 32,768
#           (a million-token prefill: ~130 s at session 24's 8,025 tok/s)
#   part c: gemma-4-31b batch 1 at 1,024 / 32,768 beside HF eager
#   part e: qwen3-14b (GQA groups of 5) at 1k / 32k, batch 1 / 8, default against
#           ATLAS_CUDA_DECODE_PLAN=shared (the CUDA-core kernels those groups took before)
#   part f: qwen3-14b batch 1 at 1k / 4k, one context a run (narrow block tables), default
#           against the CUDA-core plan the old `auto` took at that width
#   part d: gemma-4-31b batch 32 at 32,768 (a million-token prefill: ~6 minutes at part c's
#           2,746 tok/s)
# Run with carry [".whl", "dev"] as the command itself (no `| tail`); the logs and JSONs come
# back as scripts/gpu_lib.sh says.
set -uo pipefail
part=${1:?usage: gpu_session25.sh a1|a2|b|c|d|e|f}
OUT=${OUT:-$PWD/s25_out}
LOGS=/tmp/s25_logs
PLUGINS="atlas-cuda atlas-hopper atlas-qwen3 atlas-gemma4 atlas-nemotron-h atlas-minimax"
# shellcheck source=scripts/gpu_lib.sh
source scripts/gpu_lib.sh
case $part in
a1)
  tests timing 60 plugins/atlas-cuda/tests/test_fast_paths_cuda.py -k "graph"
  tests mma-decode 150 plugins/atlas-cuda/tests/test_decode_attention_mma_cuda.py
  timeout 90 python3 scripts/attn_decode_bench.py --odd-groups >"$LOGS/odd-groups.log" 2>&1
  el "odd groups: exit $?"; grep "|" "$LOGS/odd-groups.log"; pack
  tests nemotron 130 plugins/atlas-nemotron-h/tests/test_nemotron_h_cuda.py -k "greedy or router"
  tests swa-fa 150 plugins/atlas-gemma4/tests/test_gemma4_cuda.py -k "every_kernel and _tile_"
  ;;
a2)
  timeout 120 python3 scripts/gemma_prefill_bench.py >"$LOGS/prefill-bench.log" 2>&1
  el "prefill bench: exit $?"; grep "|" "$LOGS/prefill-bench.log"; pack
  bench gemma26-32k 100 gemma-4-26b-a4b 1 32768
  ATLAS_GEMMA_PREFILL_ATTENTION=fa bench gemma26-32k-fa 100 gemma-4-26b-a4b 1 32768
  bench minimax 200 minimax-m2 1,32 1024,32768
  ;;
b)
  bench gemma26-32k-hf 200 gemma-4-26b-a4b 1 32768 --baseline hf --baseline-decode-tokens 8
  bench gemma26-b32-32k 300 gemma-4-26b-a4b 32 32768
  ;;
c)
  bench gemma31-hf 240 gemma-4-31b 1 1024,32768 --baseline hf --baseline-decode-tokens 8
  ;;
d)
  bench gemma31-b32-32k 60 gemma-4-31b 32 32768   # skipped: 80.74 GiB of KV, 36.14 fit
  bench gemma31-b8-32k 240 gemma-4-31b 8 32768
  ;;
e)  # qwen3-14b (groups of 5): the tensor-core decode against the CUDA-core kernels it took before
  bench qwen14 150 qwen3-14b 1,8 1024,32768
  ATLAS_CUDA_DECODE_PLAN=shared bench qwen14-shared 150 qwen3-14b 1,8 1024,32768
  ;;
f)  # qwen3-14b batch 1 in narrow tables (one context a run), where odd groups now take the
    # tensor-core kernel past 512 keys: against the CUDA-core plan auto took before at that width
  bench q14-1k 100 qwen3-14b 1 1024
  ATLAS_CUDA_DECODE_PLAN=split bench q14-1k-split 100 qwen3-14b 1 1024
  bench q14-4k 100 qwen3-14b 1 4096
  ATLAS_CUDA_DECODE_PLAN=shared bench q14-4k-shared 100 qwen3-14b 1 4096
  ;;
*) echo "part a1, a2, b, c, d, e or f"; exit 2 ;;
esac
el done
