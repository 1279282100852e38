#!/usr/bin/env bash
# Speculative decoding (issue #27) on a GPU: exactness on CUDA, then the measurements the issue
# asks for. At most 4 minutes in all; each line has its own timeout.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

# Greedy output with n-gram-style and MTP drafts equals plain decoding on CUDA (tiny Qwen3.5 / Qwen3-Next).
timeout 60 $PY -m pytest -q -m gpu -p no:cacheprovider plugins/atlas-qwen35/tests/test_engine_hybrid_spec.py plugins/atlas-qwen35/tests/test_mtp.py
# Verify step (K + 1 = 3 positions) vs plain decode step, and tokens/s at forced full
# acceptance, qwen3.5-35b-a3b shape with random weights, batch 1 / 8 / 32.
timeout 120 $PY scripts/spec_verify_bench.py --shape qwen3.5-35b-a3b --backend cuda --batch 1 8 32 --k 2 --max-tokens 32
# n-gram and forced acceptance on the demo model through the CUDA backend, batch 1.
timeout 60 $PY scripts/spec_bench.py --backend cuda --batch 1 --k 2
