"""GPU probes for test suites (plugins' gpu tests skip, not fail, without a device).

Example (a plugin's ``tests/test_x_cuda.py``)::

    pytestmark = pytest.mark.gpu

    @pytest.fixture(scope="module")
    def cuda():
        return cuda_backend_or_skip()
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def cuda_device_count() -> int:
    """CUDA devices the driver reports when atlas-cuda is installed; 0 without either."""
    try:
        import atlas_cuda  # noqa: F401 - a plugin's [cuda] extra
        from cuda.bindings import driver
        if driver.cuInit(0)[0] != driver.CUresult.CUDA_SUCCESS:
            return 0
        err, count = driver.cuDeviceGetCount()
        return count if err == driver.CUresult.CUDA_SUCCESS else 0
    except Exception:  # noqa: BLE001 - no driver, no library
        return 0


def cuda_device_available() -> bool:
    """Whether a CUDA device and atlas-cuda are usable."""
    return cuda_device_count() > 0


def cuda_backend_or_skip(registry: Any = None) -> Any:
    """A ``cuda`` GpuBackend from ``registry`` (default: every installed plugin), or skip the
    calling test when there is no device or no atlas-cuda."""
    import pytest

    if not cuda_device_available():
        pytest.skip("no CUDA device, or atlas-cuda is not installed")
    if registry is None:
        from atlas_core.plugins import Registry
        registry = Registry()
    return registry.create("gpu_backends", "cuda")
