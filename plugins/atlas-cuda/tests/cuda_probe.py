"""Whether a CUDA device is usable (a uniquely named module: conftest is not importable)."""

from atlas_core.testing.gpu import cuda_device_available

HAS_GPU = cuda_device_available()


def rel_error(got, want, check_shape: bool = True) -> float:
    """Relative L2 error of ``got`` against ``want`` (host arrays), after asserting it is finite
    (and, by default, of the same shape)."""
    import numpy as np
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.all(np.isfinite(got)) and (not check_shape or got.shape == want.shape)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-12))


def device_rel_error(be, dev, want, check_shape: bool = True) -> float:
    """:func:`rel_error` of a device array, copied to the host first."""
    return rel_error(be.to_host(dev), want, check_shape)
