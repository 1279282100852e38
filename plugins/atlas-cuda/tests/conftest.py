"""GPU fixtures: one CudaBackend per session; every test here is skipped without a device."""

import pytest

from cuda_probe import HAS_GPU


@pytest.fixture(scope="session")
def cuda_backend():
    if not HAS_GPU:
        pytest.skip("no CUDA device")
    from atlas_cuda.backend import CudaBackend
    return CudaBackend()
