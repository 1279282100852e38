"""DeviceArray: a typed, shaped view of device memory owned by an allocation."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np


class DeviceArray:
    """A contiguous device array.

    Attributes:
        ptr: device address of the first element (int).
        shape: tuple of ints.
        dtype: NumPy dtype (``ml_dtypes`` for bf16 / fp8).
        owner: whatever keeps the memory alive (a buffer or a workspace chunk).
    """

    __slots__ = ("ptr", "shape", "dtype", "owner")

    def __init__(self, ptr: int, shape: Sequence[int], dtype: Any, owner: Any = None) -> None:
        self.ptr = int(ptr)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.owner = owner

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def reshape(self, *shape: Any) -> "DeviceArray":
        """View with a new shape (one ``-1`` allowed), same element count."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = list(shape)
        if shape.count(-1) > 1:
            raise ValueError("reshape takes at most one -1")
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = self.size // known if known else 0
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape array of shape {self.shape} into {tuple(shape)}")
        return DeviceArray(self.ptr, shape, self.dtype, self.owner)

    def __getitem__(self, key: Any) -> "DeviceArray":
        row = self.nbytes // self.shape[0] if self.shape and self.shape[0] else 0
        if isinstance(key, (int, np.integer)):
            i = int(key) + (self.shape[0] if key < 0 else 0)
            if not 0 <= i < self.shape[0]:
                raise IndexError(f"index {key} out of range for axis of size {self.shape[0]}")
            return DeviceArray(self.ptr + i * row, self.shape[1:], self.dtype, self.owner)
        if isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            if step != 1:
                raise IndexError("device arrays support only contiguous first-axis slices")
            n = max(0, stop - start)
            return DeviceArray(self.ptr + start * row, (n, *self.shape[1:]), self.dtype, self.owner)
        raise IndexError("device arrays support only first-axis integer or slice indexing")

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str if self.dtype.kind != "V"
                else f"<V{self.dtype.itemsize}", "data": (self.ptr, False), "version": 3}

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, ptr=0x{self.ptr:x})"
