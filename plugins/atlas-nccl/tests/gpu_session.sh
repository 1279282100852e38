#!/usr/bin/env bash
# GPU checks of atlas-nccl for the coordinator (a 2-GPU machine: nvidia-h100-x2 / -h200-x2).
# Needs nccl4py (pip install nccl4py-cu13, or carried as a wheel) and atlas-cuda. NVLink
# multicast stays off (the lent machines must keep NCCL_NVLS_ENABLE=0). Timeouts add up to 4 min.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PY:-python3}
if [[ -d .whl ]]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
timeout 45 $PY -m pip install -q --no-deps --no-build-isolation -e . -e plugins/atlas-qwen3 \
  -e plugins/atlas-cuda -e plugins/atlas-hopper -e plugins/atlas-nccl || exit 1
timeout 15 $PY -c "import nccl.core, sys; print('nccl4py', nccl.core.get_version())" || exit 1
timeout 60 $PY -m pytest -q -p no:cacheprovider plugins/atlas-nccl/tests/test_nccl_kernels_compile.py
timeout 120 $PY -m pytest -q -p no:cacheprovider -m gpu plugins/atlas-nccl/tests/test_parallel_cuda.py
