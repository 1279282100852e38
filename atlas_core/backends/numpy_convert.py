"""Fast float32 views of low-precision arrays for the numpy backend, and the weight cache.

The references convert with ``astype(np.float32)``; ml_dtypes does that quickly for bf16 but
slowly for fp8, so fp8 goes through a 256-entry lookup table (bit-exact with ml_dtypes).
"""

from __future__ import annotations

import weakref

import numpy as np

from atlas_core.ops._dtypes import bfloat16, float8_e4m3fn
from atlas_core.ops.quant import QuantizedWeight, dequantize

_FP8_TO_F32 = np.arange(256, dtype=np.uint8).view(float8_e4m3fn).astype(np.float32)
_CODES_16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
_LUTS = {float8_e4m3fn: (np.uint8, _FP8_TO_F32),
         bfloat16: (np.uint16, _CODES_16.view(bfloat16).astype(np.float32)),
         np.dtype(np.float16): (np.uint16, _CODES_16.view(np.float16).astype(np.float32))}


def to_f32(a: np.ndarray) -> np.ndarray:
    """``a`` as float32: ``a`` itself when already float32, else a converted copy (the exact
    dequantization of a :class:`~atlas_core.ops.quant.QuantizedWeight`)."""
    if isinstance(a, QuantizedWeight):
        return dequantize(a)
    if a.dtype == np.float32:
        return a
    if a.dtype == float8_e4m3fn:
        return _FP8_TO_F32[a.view(np.uint8)]
    return a.astype(np.float32)


def as_codes(a: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(codes, lut)`` with ``lut[codes] == a.astype(float32)`` for 8/16-bit float dtypes, else None.

    Kernels read low-precision storage (KV caches) through this without converting it first.
    """
    entry = _LUTS.get(a.dtype)
    if entry is None:
        return None
    return a.view(entry[0]), entry[1]


class Float32Cache:
    """float32 copies of long-lived low-precision arrays (weights), keyed by array identity.

    A :class:`~atlas_core.ops.quant.QuantizedWeight` is dequantized once into the cache like any
    low-precision array (the model keeps holding the quantized arrays).

    An entry holds a weak reference to its source and is dropped the moment the source is
    garbage-collected, so a recycled ``id()`` can never hit a stale copy. Arrays are assumed not
    to change after their first use as a weight unless written through the backend's copy
    methods, which call :meth:`invalidate`.
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes held by cached float32 copies."""
        return sum(copy.nbytes for _, copy in self._entries.values())

    def get(self, a: np.ndarray) -> np.ndarray:
        """float32 version of ``a``, converted once per array object."""
        if not isinstance(a, QuantizedWeight) and a.dtype == np.float32:
            return a
        key = id(a)
        hit = self._entries.get(key)
        if hit is not None and hit[0]() is a:
            return hit[1]
        converted = to_f32(a)
        ref = weakref.ref(a, lambda r, k=key: self._drop(k, r))
        self._entries[key] = (ref, converted)
        return converted

    def _drop(self, key: int, ref: weakref.ref) -> None:
        hit = self._entries.get(key)
        if hit is not None and hit[0] is ref:
            del self._entries[key]

    def invalidate(self, written: np.ndarray) -> None:
        """Forget cached copies of any array sharing memory with ``written``."""
        if not self._entries:
            return
        for key, (ref, _) in list(self._entries.items()):
            src = ref()
            if src is None or any(np.may_share_memory(part, written) for part in _parts(src)):
                self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()


def _parts(src) -> tuple[np.ndarray, ...]:
    if isinstance(src, QuantizedWeight):
        return tuple(a for a in (src.data, src.scale, src.global_scale) if a is not None)
    return (src,)
