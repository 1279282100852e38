"""Thin checked wrappers over ``cuda.bindings.driver`` for what cuda.core does not cover."""

from __future__ import annotations

from typing import Any


class CudaError(RuntimeError):
    """A CUDA driver call failed."""


def drv():
    from cuda.bindings import driver
    return driver


def check(result: Any) -> Any:
    """Raise on a non-success ``CUresult``; return the remaining values (one, a tuple, or None)."""
    driver = drv()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise CudaError(f"CUDA driver error {name.decode() if name else err}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


class DeviceAllocation:
    """``cuMemAlloc`` memory freed when the last reference goes."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = max(int(nbytes), 1)
        self.ptr = int(check(drv().cuMemAlloc(self.nbytes)))

    def __del__(self) -> None:
        ptr, self.ptr = getattr(self, "ptr", 0), 0
        if ptr:
            try:
                drv().cuMemFree(ptr)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass


class PinnedAllocation:
    """Page-locked host memory (``cuMemAllocHost``) exposed as a NumPy byte array."""

    def __init__(self, nbytes: int) -> None:
        import ctypes

        import numpy as np
        self.nbytes = int(nbytes)
        self.ptr = int(check(drv().cuMemAllocHost(self.nbytes)))
        buf = (ctypes.c_uint8 * self.nbytes).from_address(self.ptr)
        self.array = np.frombuffer(buf, dtype=np.uint8)

    def __del__(self) -> None:
        ptr, self.ptr = getattr(self, "ptr", 0), 0
        if ptr:
            try:
                drv().cuMemFreeHost(ptr)
            except Exception:  # noqa: BLE001
                pass
