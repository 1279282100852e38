"""NVFP4 KV-cache rows: the exact quantization every backend's cache write must reproduce.

A KV pool whose dtype is ``uint8`` is NVFP4-packed (``--kv-cache-dtype nvfp4``): it is shaped
``[num_blocks, block_size, num_kv_heads, head_dim / 2 + head_dim / 16]`` and each
``(token, kv head)`` row of ``head_dim`` values ``x`` is stored as

- bytes ``0 .. head_dim/2 - 1``: E2M1 codes, two per byte; byte ``j`` holds element ``2j`` in
  its low nibble and element ``2j + 1`` in its high nibble (the packing of NVFP4 weights,
  :mod:`atlas_core.ops.quant`);
- bytes ``head_dim/2 ..``: one float8_e4m3fn scale per group of 16 consecutive elements.

Dequantization: ``x[i] = e2m1(code[i]) * float(scale[i // 16])`` (exact in float32; there is no
second, global scale: the cache's ``kv_scale`` stays 1.0). 16-element groups with e4m3 scales
are the original engine's layout; at head_dim 128 a row is 72 bytes instead of 256 in bf16.

Quantization of one group ``g`` (16 float32 values), bit-exact, the rule the CUDA cache-write
kernels implement too:

1. ``amax = max(|g|)`` (NaN elements ignored); ``s = e4m3(min(amax / 6, 448))`` where ``/`` is
   the IEEE float32 division and ``e4m3`` rounds to nearest, ties to even, subnormals included
   (``__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3)``). The scale byte is ``s``.
2. If ``s == 0`` (an all-zero group, or ``amax < 6 * 2**-10``) every code is 0.
3. Else for each element ``q = |x| / s`` (IEEE float32 division) and the magnitude index is
   ``(q > 0.25) + (q >= 0.75) + (q > 1.25) + (q >= 1.75) + (q > 2.5) + (q >= 3.5) + (q > 5)``:
   round to nearest on the grid ``0, 0.5, 1, 1.5, 2, 3, 4, 6``, ties to the even index,
   saturating at 6 (``s`` may round below ``amax / 6``); NaN gives index 0. The code is the
   index plus 8 when ``x < 0`` (so a small negative value may be stored as -0; ``-0.0`` itself
   is not ``< 0`` and gets code 0).
"""

from __future__ import annotations

import numpy as np

from atlas_core.ops._dtypes import float8_e4m3fn
from atlas_core.ops.quant import E2M1_LUT

#: Elements sharing one e4m3 scale.
KV_GROUP = 16
#: ``head_dim`` of an NVFP4 cache must be a multiple of this (whole bytes of codes and scales,
#: and whole 16-byte vectors of codes for the CUDA kernels).
KV_HEAD_DIM_MULTIPLE = 32
#: Largest finite float8_e4m3fn value.
E4M3_MAX = 448.0

_FP8_TO_F32 = np.arange(256, dtype=np.uint8).view(float8_e4m3fn).astype(np.float32)
_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False),
               (3.5, True), (5.0, False))


def nvfp4_row_bytes(head_dim: int) -> int:
    """Bytes of one packed ``(token, kv head)`` row: ``head_dim / 2 + head_dim / 16``."""
    return head_dim // 2 + head_dim // KV_GROUP


def nvfp4_head_dim(row_bytes: int) -> int:
    """The ``head_dim`` whose packed row is ``row_bytes`` long (the inverse of
    :func:`nvfp4_row_bytes`)."""
    head_dim = row_bytes * KV_GROUP // 9
    if nvfp4_row_bytes(head_dim) != row_bytes:
        raise ValueError(f"{row_bytes} bytes is not an nvfp4 KV row (head_dim/2 + head_dim/16)")
    return head_dim


def check_nvfp4_head_dim(head_dim: int, what: str = "layer") -> None:
    """Raise ``ValueError`` unless ``head_dim`` can be stored as nvfp4 KV."""
    if head_dim % KV_HEAD_DIM_MULTIPLE:
        raise ValueError(f"{what}: head_dim {head_dim} is not a multiple of "
                         f"{KV_HEAD_DIM_MULTIPLE}, so its KV cache cannot be nvfp4; use "
                         "--kv-cache-dtype fp8 or bf16, or keep the layer in "
                         "--kv-high-precision-layers")


def quantize_kv_nvfp4(x: np.ndarray) -> np.ndarray:
    """Pack ``x`` ``[..., head_dim]`` into nvfp4 rows ``uint8 [..., head_dim/2 + head_dim/16]``
    by the rule of the module docstring (``head_dim`` a multiple of 16)."""
    x = np.asarray(x, dtype=np.float32)
    d = x.shape[-1]
    if d % KV_GROUP:
        raise ValueError(f"nvfp4 KV rows need head_dim a multiple of {KV_GROUP}, got {d}")
    groups = x.reshape(*x.shape[:-1], d // KV_GROUP, KV_GROUP)
    mag = np.abs(groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        amax = np.max(np.where(np.isnan(mag), np.float32(0), mag), axis=-1)
        scale = np.minimum(amax / np.float32(6), np.float32(E4M3_MAX)).astype(float8_e4m3fn)
        s = scale.astype(np.float32)[..., None]
        q = np.where(s > 0, mag / np.where(s > 0, s, np.float32(1)), np.float32(0))
    idx = np.zeros(q.shape, dtype=np.uint8)
    for edge, inclusive in _THRESHOLDS:
        idx += (q >= edge) if inclusive else (q > edge)
    codes = np.where((groups < 0) & (s > 0), idx + 8, idx).astype(np.uint8)
    codes = codes.reshape(*x.shape[:-1], d)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return np.concatenate([packed, scale.view(np.uint8)], axis=-1)


def dequantize_kv_nvfp4(packed: np.ndarray, head_dim: int | None = None) -> np.ndarray:
    """The float32 values ``[..., head_dim]`` of nvfp4 rows ``uint8 [..., head_dim/2 +
    head_dim/16]`` (``head_dim`` defaults to the one the row width implies)."""
    packed = np.asarray(packed)
    d = nvfp4_head_dim(packed.shape[-1]) if head_dim is None else int(head_dim)
    if packed.shape[-1] != nvfp4_row_bytes(d):
        raise ValueError(f"nvfp4 KV rows of head_dim {d} are {nvfp4_row_bytes(d)} bytes, "
                         f"got {packed.shape[-1]}")
    codes = packed[..., :d // 2]
    values = np.empty((*packed.shape[:-1], d), dtype=np.float32)
    values[..., 0::2] = E2M1_LUT[codes & 0xF]
    values[..., 1::2] = E2M1_LUT[codes >> 4]
    scales = _FP8_TO_F32[packed[..., d // 2:]]
    values = values.reshape(*packed.shape[:-1], d // KV_GROUP, KV_GROUP) * scales[..., None]
    return values.reshape(*packed.shape[:-1], d)


def is_nvfp4_cache(cache) -> bool:
    """A ``uint8`` KV pool is nvfp4-packed (the only 8-bit integer cache dtype)."""
    return np.dtype(cache.dtype) == np.uint8
