"""The shared GpuBackend contract on the cuda backend (skipped without a GPU)."""

import pytest

from atlas_core.testing.contracts import GpuBackendContract

from cuda_probe import HAS_GPU

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")]


class TestCudaBackend(GpuBackendContract):
    backend_name = "cuda"
