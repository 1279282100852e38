"""Whether a CUDA device and the ``atlas-nemotron-h[cuda]`` extra are usable (a uniquely named
module: conftest is not importable)."""


def _has_gpu() -> bool:
    try:
        import atlas_cuda  # noqa: F401 - the [cuda] extra
        from cuda.bindings import driver
        if driver.cuInit(0)[0] != driver.CUresult.CUDA_SUCCESS:
            return False
        err, n = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and n > 0
    except Exception:  # noqa: BLE001 - no driver, no library
        return False


HAS_GPU = _has_gpu()
