"""Shared test setup: tests marked ``gpu`` are skipped when no CUDA device is present."""

from __future__ import annotations

import ctypes
import functools

import pytest


@functools.cache
def has_cuda_device() -> bool:
    """True when the CUDA driver reports at least one device (checked through ctypes, so no
    GPU Python library gets imported into the test process)."""
    for lib in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            cuda = ctypes.CDLL(lib)
        except OSError:
            continue
        count = ctypes.c_int(0)
        return cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0 \
            and count.value > 0
    return False


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and not has_cuda_device():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (none found)")
        for item in gpu_items:
            item.add_marker(skip)
