#!/usr/bin/env bash
# The command run on the lent GPU machine to train, check and evaluate the demo model.
# Usage: OUT=/some/dir bash scripts/demo_model/run_gpu.sh   (see docs/demo-model.md)
set -o pipefail
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
OUT=${OUT:-/tmp/atlas-demo-out}
mkdir -p "$OUT"
cd "$(dirname "$0")" || exit 1
nvidia-smi -L
python3 -c "import torch, transformers, tokenizers as t; print(torch.__version__, transformers.__version__, t.__version__)"
python3 train.py --out "$OUT/atlas-demo" --repro-steps 40 \
    --max-train-seconds "${TRAIN_SECONDS:-230}" 2>&1 | tee "$OUT/train.log" || exit 1
python3 eval.py --hf --device cuda --model "$OUT/atlas-demo" --json "$OUT/eval.json" 2>&1 \
    | grep -v "Loading weights" | tee -a "$OUT/train.log"
