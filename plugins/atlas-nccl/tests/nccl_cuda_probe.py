"""Whether a CUDA device, atlas-cuda and nccl4py are usable (a uniquely named module: conftest
is not importable)."""

from atlas_core.testing.gpu import cuda_device_count


def _has_nccl4py() -> bool:
    try:
        import nccl.core  # noqa: F401
        return True
    except Exception:  # noqa: BLE001 - not installed, or no libnccl
        return False


NUM_GPUS = cuda_device_count()
HAS_GPU = NUM_GPUS > 0
HAS_NCCL = _has_nccl4py()
