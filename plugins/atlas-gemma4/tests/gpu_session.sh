#!/usr/bin/env bash
# What the coordinator runs on the lent GPU for atlas-gemma4 (from the repository root).
# Today the cuda backend lacks the plugin's ops (mul, softcap, sliding_window_attention): the gpu
# test checks that loading refuses cleanly, naming them. Once cuda implementations are
# registered, the bench lines below give batch 1 / 32 at 1k / 32k context for both shapes.
set -euo pipefail
.venv/bin/python -m pytest -q -m gpu plugins/atlas-gemma4/tests -p no:cacheprovider
if [[ "${GEMMA4_BENCH:-0}" == 1 ]]; then
  for shape in gemma-4-31b gemma-4-26b-a4b; do
    .venv/bin/atlas bench --model "$shape" --backend cuda --batch 1,32 --context 1024,32768
  done
fi
