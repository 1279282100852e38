"""GPU fixtures: one CudaBackend per session; every test here is skipped without a device."""

import pytest


def _has_gpu() -> bool:
    try:
        from cuda.bindings import driver
        if driver.cuInit(0)[0] != driver.CUresult.CUDA_SUCCESS:
            return False
        err, n = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and n > 0
    except Exception:  # noqa: BLE001 - no driver, no library
        return False


HAS_GPU = _has_gpu()


@pytest.fixture(scope="session")
def cuda_backend():
    if not HAS_GPU:
        pytest.skip("no CUDA device")
    from atlas_cuda.backend import CudaBackend
    return CudaBackend()
