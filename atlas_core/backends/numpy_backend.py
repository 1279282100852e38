"""The ``numpy`` GpuBackend: host memory, NumPy + numba ops. The CPU reference and laptop backend."""

from __future__ import annotations

import os
import platform
from typing import Any, Sequence

import numpy as np

from atlas_core.backends.numpy_convert import Float32Cache
from atlas_core.interfaces import DeviceInfo, GpuBackend
from atlas_core.ops._dtypes import as_dtype
from atlas_core.ops.quant import FORMATS
from atlas_core.ops.registry import OpRegistry


def host_memory() -> tuple[int, int]:
    """``(available_bytes, total_bytes)`` of host RAM (``/proc/meminfo``, else ``sysconf``)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, total
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"), total
    except (ValueError, OSError):
        return total, total


def _check_same_size(dst: np.ndarray, src: np.ndarray, what: str) -> None:
    if dst.size != src.size:
        raise ValueError(f"{what}: destination has {dst.size} elements {dst.shape} but source has "
                         f"{src.size} {src.shape}; sizes must match")


class NumpyBackend(GpuBackend):
    """Arrays are ``np.ndarray`` in host memory; ops run with NumPy (fp32 accumulation) and numba.

    Storage dtypes are whatever the caller asks for (bf16 / fp16 / fp32, fp8 for KV caches via
    ``ml_dtypes``). Op outputs are fresh arrays, so :meth:`reset_workspace` has nothing to do.
    ``ops`` holds every registered op: the numpy implementation, else the unfused definition,
    else the reference.

    Args:
        cache_weights: keep a float32 copy of each low-precision or quantized weight the
            first time an op reads it (faster decode at the cost of 2x weight memory for bf16
            models).
        op_registry: the registered ops (default: those of a fresh plugin manager).
        **options: other factory options (``device_id``, ``memory_utilization``…) are ignored.
    """

    name = "numpy"
    #: Every quantized weight format: the weight-reading ops dequantize (once, into the cache).
    quantized_weight_formats = frozenset(FORMATS)
    #: KV pools of every ``--kv-cache-dtype``, nvfp4 included (dequantized per step).
    kv_cache_dtypes = frozenset({"bf16", "fp8", "nvfp4"})

    def __init__(self, *, cache_weights: bool = True, op_registry: OpRegistry | None = None,
                 **options: Any) -> None:
        self.weight_cache = Float32Cache() if cache_weights else None
        self.op_registry = op_registry if op_registry is not None else OpRegistry.load()
        self.ops = self.op_registry.build_table("numpy", self, use_reference=True)

    def set_batch_invariant(self, on: bool) -> None:
        """Nothing to change: every numpy op already computes a row the same way whatever else
        is in the call (docs/serving.md, Determinism)."""

    def device_info(self) -> DeviceInfo:
        cpu = platform.processor() or platform.machine() or "cpu"
        return DeviceInfo(name=f"cpu ({cpu}, {os.cpu_count()} cores)", kind="cpu",
                          total_memory=host_memory()[1])

    def memory_info(self) -> tuple[int, int]:
        return host_memory()

    def empty(self, shape: Sequence[int], dtype: Any) -> np.ndarray:
        return np.empty(tuple(shape), dtype=as_dtype(dtype))

    def zeros(self, shape: Sequence[int], dtype: Any) -> np.ndarray:
        return np.zeros(tuple(shape), dtype=as_dtype(dtype))

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return np.array(array, copy=True, order="C")

    def copy_from_host(self, dst: np.ndarray, src: np.ndarray) -> None:
        src = np.asarray(src)
        _check_same_size(dst, src, "copy_from_host")
        if src.dtype != dst.dtype:
            raise ValueError(f"copy_from_host: source dtype {src.dtype} differs from destination "
                             f"dtype {dst.dtype}; convert on the host first (src.astype(...))")
        self._invalidate(dst)
        np.copyto(dst, src.reshape(dst.shape))

    def to_host(self, array: np.ndarray) -> np.ndarray:
        return np.array(array, copy=True)

    def copy_to_host_async(self, dst: np.ndarray, src: np.ndarray) -> None:
        if dst.nbytes != src.nbytes:
            raise ValueError(f"copy_to_host_async: {src.nbytes} bytes into {dst.nbytes}")
        np.copyto(dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8))

    def copy_(self, dst: np.ndarray, src: np.ndarray) -> None:
        if dst.shape != src.shape or dst.dtype != src.dtype:
            raise ValueError(f"copy_: destination {dst.shape} {dst.dtype} and source {src.shape} "
                             f"{src.dtype} must have the same shape and dtype")
        self._invalidate(dst)
        np.copyto(dst, src)

    def synchronize(self) -> None:
        """Nothing to wait for: every op has finished when it returns."""

    def _invalidate(self, dst: np.ndarray) -> None:
        if self.weight_cache is not None:
            self.weight_cache.invalidate(dst)

    def close(self) -> None:
        if self.weight_cache is not None:
            self.weight_cache.clear()
