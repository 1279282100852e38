#!/usr/bin/env bash
# What the coordinator runs on the lent GPU for atlas-qwen3vl, from the repository root (about
# 4 minutes). Logs go to $OUT (or ./qwen3vl_gpu_out); every step has its own time limit.
#   1. pytest -m gpu: the vision ops (layer_norm, gelu, vision_attention, interpolate_pos_embed)
#      against their references, vision_attention at head_dim 72 (and a 1024-patch image in
#      bf16 through core's tensor-core bidirectional attention), and the tiny Qwen3-VL
#      checkpoint's image features and greedy tokens (image + text requests) on cuda = numpy.
#   2. atlas bench qwen3-vl-30b-a3b (random bf16 weights on the device): decode at batch 1 and
#      the vision lines: encode time of a 1024x1024 image, TTFT of image + 100 tokens.
set -uo pipefail
OUT=${OUT:-$PWD/qwen3vl_gpu_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 ATLAS_CACHE_DIR=${ATLAS_CACHE_DIR:-/tmp/atlas-cache}
$PY -m pip install -q --no-deps --no-build-isolation -e . -e plugins/atlas-cuda \
  -e plugins/atlas-hopper -e plugins/atlas-qwen3 -e plugins/atlas-qwen35 \
  -e plugins/atlas-qwen3vl >"$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
$PY -m pip install -q pillow >>"$OUT/install.log" 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
git log --oneline -1 2>/dev/null | tee -a "$OUT/gpu.txt"

timeout -s INT 100 $PY -m pytest -q -m gpu plugins/atlas-qwen3vl/tests -p no:cacheprovider \
  2>&1 | tee "$OUT/tests.log" | tail -15

timeout -s INT 20 $PY -m atlas_core bench --model tiny-qwen3-vl --backend cuda --context 64 \
  --decode-tokens 8 --image-size 1024 >"$OUT/bench-tiny.log" 2>&1
echo "tiny-qwen3-vl: exit $?"; tail -3 "$OUT/bench-tiny.log"

timeout -s INT 100 $PY -m atlas_core bench --model qwen3-vl-30b-a3b --backend cuda --batch 1 \
  --context 1024 --decode-tokens 32 --image-size 1024 --gpu-memory-utilization 0.9 \
  >"$OUT/bench-30b.log" 2>&1
echo "qwen3-vl-30b-a3b: exit $?"; tail -6 "$OUT/bench-30b.log"
