"""Whether a CUDA device, atlas-cuda and nccl4py are usable (a uniquely named module: conftest
is not importable)."""


def _device_count() -> int:
    try:
        import atlas_cuda  # noqa: F401 - the [nccl] extra's cuda backend
        from cuda.bindings import driver
        if driver.cuInit(0)[0] != driver.CUresult.CUDA_SUCCESS:
            return 0
        err, n = driver.cuDeviceGetCount()
        return n if err == driver.CUresult.CUDA_SUCCESS else 0
    except Exception:  # noqa: BLE001 - no driver, no library
        return 0


def _has_nccl4py() -> bool:
    try:
        import nccl.core  # noqa: F401
        return True
    except Exception:  # noqa: BLE001 - not installed, or no libnccl
        return False


NUM_GPUS = _device_count()
HAS_GPU = NUM_GPUS > 0
HAS_NCCL = _has_nccl4py()
