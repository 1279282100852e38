"""Quantized weights in the op contract: :class:`QuantizedWeight` and its exact NumPy meaning.

A weight-taking op (``linear``, ``linear_act_and_mul``, ``rms_norm_linear``, ``moe_experts``,
``moe_block``, ``rms_norm_moe_block``) accepts, wherever it takes a ``[..., N, K]`` weight array,
a :class:`QuantizedWeight` of the same logical ``shape``. The op's meaning does not change: the
reference computes with ``dequantize(w)`` (float32) in place of ``weight.astype(float32)``, so
``linear(x, w) = (x.astype(f32) @ dequantize(w).T).astype(x.dtype)``. Activations are never
quantized by the contract (W8A16 / W4A16); a backend that runs FP8 tensor cores on quantized
activations must stay within its documented tolerance of that reference. Model code never sees
the difference: the loader puts a ``QuantizedWeight`` where an array would be.

Layouts (``L`` = leading dims of ``shape``: ``()`` for a linear, ``(E,)`` for stacked experts;
``N`` = output rows, ``K`` = input columns; all arrays C-contiguous, row-major):

- ``fp8_block``: ``data`` float8_e4m3fn ``[*L, N, K]``; ``scale`` float32
  ``[*L, ceil(N/bn), ceil(K/bk)]``; no ``global_scale``.
- ``fp8_tensor``: ``data`` float8_e4m3fn ``[*L, N, K]``; ``scale`` float32 ``[*L]`` (a 0-d
  array for ``L = ()``); no ``global_scale``.
- ``fp8_channel``: ``data`` float8_e4m3fn ``[*L, N, K]``; ``scale`` float32 ``[*L, N]``; no
  ``global_scale``.
- ``nvfp4``: ``data`` uint8 ``[*L, N, K/2]``; ``scale`` float8_e4m3fn ``[*L, N, K/16]``;
  ``global_scale`` float32 ``[*L]``.

Dequantization (exact in float32; every scale is a multiplier, never a divisor):

- ``fp8_block``: ``w[..., n, k] = data[..., n, k] * scale[..., n // bn, k // bk]`` with
  ``block_size = (bn, bk)`` (128 x 128 in Qwen / DeepSeek FP8). The last block row / column may
  be partial.
- ``fp8_tensor``: ``w = data * scale[..., None, None]``.
- ``fp8_channel``: ``w = data * scale[..., :, None]``.
- ``nvfp4``: ``block_size = (1, 16)``. Byte ``data[..., n, j]`` holds two E2M1 codes: the low
  nibble is element ``k = 2j``, the high nibble ``k = 2j + 1`` (ModelOpt's and
  compressed-tensors' packing). A code ``c`` (bit 3 the sign, bits 0-2 the magnitude index)
  means ``(-1 if c & 8 else 1) * E2M1_VALUES[c & 7]`` with magnitudes
  ``0, 0.5, 1, 1.5, 2, 3, 4, 6``. Then
  ``w[..., n, k] = e2m1(data, n, k) * float(scale[..., n, k // 16]) * global_scale[...]``:
  ModelOpt's convention (``weight_scale_2``); compressed-tensors stores the inverse
  (``weight_global_scale``) and the loader inverts it. ``K`` is a multiple of 16.

``input_scale`` is the checkpoint's static activation scale (a float, ModelOpt / compressed-
tensors ``input_scale`` or ``1 / input_global_scale``) when there is one; the reference ignores
it, an FP8 / FP4 activation path may use it. ``dtype`` is the activation / output dtype the
model runs in (bf16 usually). Arrays are backend arrays (host ``np.ndarray`` on numpy, device
arrays on cuda): :func:`dequantize` needs host ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from atlas_core.ops._dtypes import float8_e4m3fn

FORMATS = ("fp8_block", "fp8_tensor", "fp8_channel", "nvfp4")

#: Magnitudes of the E2M1 (FP4) codes 0-7; codes 8-15 are their negatives.
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
E2M1_LUT = np.concatenate([E2M1_VALUES, -E2M1_VALUES])

NVFP4_GROUP_SIZE = 16

_FP8_LUT = np.arange(256, dtype=np.uint8).view(float8_e4m3fn).astype(np.float32)


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A ``[..., N, K]`` weight kept in its checkpoint's quantized format (see module docs).

    Compared and hashed by identity (it holds arrays), so caches can key on it.

    Attributes:
        format: one of :data:`FORMATS`.
        data: the quantized values (fp8 codes, or packed E2M1 pairs for ``nvfp4``).
        scale: block / tensor / channel multipliers (``nvfp4``: fp8 block scales).
        shape: the logical (dequantized) shape ``(*L, N, K)``.
        dtype: the activation / output dtype of ops reading this weight.
        block_size: ``(bn, bk)`` for ``fp8_block``, ``(1, 16)`` for ``nvfp4``, else None.
        global_scale: ``nvfp4`` only: float32 ``[*L]`` second-level multiplier.
        input_scale: the checkpoint's static activation scale, if any (informational).
    """

    format: str
    data: Any
    scale: Any
    shape: tuple[int, ...]
    dtype: Any
    block_size: tuple[int, int] | None = None
    global_scale: Any = None
    input_scale: float | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"unknown quantized format {self.format!r}; use one of "
                             f"{', '.join(FORMATS)}")
        shape = tuple(int(d) for d in self.shape)
        object.__setattr__(self, "shape", shape)
        if len(shape) < 2:
            raise ValueError(f"a quantized weight is [..., N, K], got shape {list(shape)}")
        if self.format == "nvfp4" and self.block_size is None:
            object.__setattr__(self, "block_size", (1, NVFP4_GROUP_SIZE))
        if self.block_size is not None:
            object.__setattr__(self, "block_size", tuple(int(b) for b in self.block_size))
        expected = layout(self.format, shape, self.block_size)
        for part in ("data", "scale", "global_scale"):
            want, got = expected[part], getattr(self, part)
            got_shape = None if got is None else tuple(got.shape)
            if want != got_shape:
                raise ValueError(f"{self.format} weight of shape {list(shape)}: {part} has shape "
                                 f"{got_shape}, expected {want}")

    @property
    def lead(self) -> tuple[int, ...]:
        """Leading (expert) dims of :attr:`shape`."""
        return self.shape[:-2]

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (data, scales)."""
        return sum(int(a.nbytes) for a in (self.data, self.scale, self.global_scale)
                   if a is not None)

    def replace(self, **changes: Any) -> "QuantizedWeight":
        """A copy with some fields replaced (e.g. device arrays for host ones)."""
        return replace(self, **changes)

    def __getitem__(self, key: int | slice) -> "QuantizedWeight":
        """``w[e]``: expert ``e`` of stacked experts; ``w[a:b]``: output rows ``a:b`` of a
        ``[N, K]`` weight (views of the same arrays; for ``fp8_block`` ``a`` must start a
        block row).

        Raises:
            IndexError: any other index, or rows that split an FP8 scale block.
        """
        if isinstance(key, (int, np.integer)) and self.lead:
            pick = lambda a: None if a is None else a[key]  # noqa: E731
            return replace(self, data=self.data[key], scale=pick(self.scale),
                           global_scale=pick(self.global_scale), shape=self.shape[1:])
        if not isinstance(key, slice) or self.lead or key.step not in (None, 1):
            raise IndexError(f"a {self.format} weight of shape {list(self.shape)} takes an expert "
                             f"index or a row range, not {key!r}")
        start, stop, _ = key.indices(self.shape[0])
        stop = max(stop, start)
        scale = self.scale
        if self.format == "fp8_block":
            bn = self.block_size[0]
            if start % bn or (stop % bn and stop != self.shape[0]):
                raise IndexError(f"rows {start}:{stop} split the {bn}-row scale blocks of an "
                                 "fp8_block weight")
            scale = scale[start // bn: -(-stop // bn)]
        elif self.format != "fp8_tensor":
            scale = scale[start:stop]
        return replace(self, data=self.data[start:stop], scale=scale,
                       shape=(stop - start, self.shape[1]))


def layout(fmt: str, shape: tuple[int, ...], block_size: tuple[int, int] | None = None
           ) -> dict[str, tuple[int, ...] | None]:
    """The shapes of ``data``, ``scale`` and ``global_scale`` of a ``fmt`` weight of ``shape``.

    Raises:
        ValueError: ``block_size`` missing for ``fp8_block``, or ``K`` not a multiple of 16 for
            ``nvfp4``.
    """
    *lead, n, k = shape
    lead = tuple(lead)
    if fmt == "fp8_block":
        if block_size is None:
            raise ValueError("fp8_block needs block_size=(bn, bk)")
        bn, bk = block_size
        return {"data": shape, "scale": (*lead, -(-n // bn), -(-k // bk)), "global_scale": None}
    if fmt == "fp8_tensor":
        return {"data": shape, "scale": lead, "global_scale": None}
    if fmt == "fp8_channel":
        return {"data": shape, "scale": (*lead, n), "global_scale": None}
    if fmt == "nvfp4":
        if k % NVFP4_GROUP_SIZE:
            raise ValueError(f"nvfp4 needs K divisible by {NVFP4_GROUP_SIZE}, got K={k}")
        return {"data": (*lead, n, k // 2), "scale": (*lead, n, k // NVFP4_GROUP_SIZE),
                "global_scale": lead}
    raise ValueError(f"unknown quantized format {fmt!r}; use one of {', '.join(FORMATS)}")


def unpack_e2m1(packed: np.ndarray) -> np.ndarray:
    """``uint8 [..., K/2]`` packed E2M1 pairs -> float32 ``[..., K]`` (low nibble first)."""
    packed = np.asarray(packed).view(np.uint8)
    out = np.empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=np.float32)
    out[..., 0::2] = E2M1_LUT[packed & 0x0F]
    out[..., 1::2] = E2M1_LUT[packed >> 4]
    return out


def _fp8_f32(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return _FP8_LUT[a.view(np.uint8)] if a.dtype == float8_e4m3fn else a.astype(np.float32)


def dequantize(w: QuantizedWeight) -> np.ndarray:
    """The exact float32 ``[*L, N, K]`` value of a host :class:`QuantizedWeight`."""
    *_, n, k = w.shape
    if w.format == "nvfp4":
        scale = _fp8_f32(w.scale)
        vals = unpack_e2m1(w.data).reshape(*w.lead, n, k // NVFP4_GROUP_SIZE, NVFP4_GROUP_SIZE)
        g = np.asarray(w.global_scale, dtype=np.float32)[..., None, None]
        return (vals * (scale * g)[..., None]).reshape(w.shape)
    data = _fp8_f32(w.data)
    scale = np.asarray(w.scale, dtype=np.float32)
    if w.format == "fp8_tensor":
        return data * scale[..., None, None]
    if w.format == "fp8_channel":
        return data * scale[..., :, None]
    bn, bk = w.block_size
    full = np.repeat(np.repeat(scale, bn, axis=-2), bk, axis=-1)[..., :n, :k]
    return data * full


def weight_f32(w: Any) -> np.ndarray:
    """float32 value of a host weight: :func:`dequantize` for a :class:`QuantizedWeight`, else
    ``astype(float32)`` (no copy when already float32). What the references compute with."""
    if isinstance(w, QuantizedWeight):
        return dequantize(w)
    return np.asarray(w, dtype=np.float32)


def is_quantized(w: Any) -> bool:
    """Whether ``w`` is a :class:`QuantizedWeight`."""
    return isinstance(w, QuantizedWeight)


def fp8_codes(values: np.ndarray) -> np.ndarray:
    """float32 -> float8_e4m3fn, saturating at +-448 (no NaN from overflow)."""
    return np.clip(values, -448.0, 448.0).astype(float8_e4m3fn)


def _e2m1_encode(values: np.ndarray) -> np.ndarray:
    mag = np.abs(values)[..., None]
    codes = np.argmin(np.abs(mag - E2M1_VALUES), axis=-1).astype(np.uint8)
    return codes | (np.signbit(values).astype(np.uint8) << 3)


def _safe(amax: np.ndarray, limit: float) -> np.ndarray:
    return np.where(amax > 0, amax / limit, 1.0).astype(np.float32)


def quantize(w: np.ndarray, fmt: str, *, block_size: tuple[int, int] = (128, 128),
             dtype: Any = np.float32) -> QuantizedWeight:
    """Quantize a float ``[*L, N, K]`` host array to ``fmt`` the way the checkpoint producers do
    (amax scaling: FP8 to +-448; NVFP4 blocks of 16 to +-6 with an fp8 block scale under a
    per-matrix global scale, rounded up to a power of two so that its inverse, which
    compressed-tensors stores, is exact). For tests and random benchmark weights; not
    bit-identical to any producer, but :func:`dequantize` of the result is exact by definition."""
    w = np.asarray(w, dtype=np.float32)
    *lead, n, k = w.shape
    lead = tuple(lead)
    if fmt == "nvfp4":
        groups = w.reshape(*lead, n, k // NVFP4_GROUP_SIZE, NVFP4_GROUP_SIZE)
        g = np.exp2(np.ceil(np.log2(_safe(np.abs(w).max(axis=(-2, -1)), 6.0 * 448.0))))
        g = g.astype(np.float32)
        block = (_safe(np.abs(groups).max(axis=-1), 6.0) / g[..., None, None]).astype(float8_e4m3fn)
        denom = block.astype(np.float32) * g[..., None, None]
        codes = _e2m1_encode(groups / np.where(denom > 0, denom, 1.0)[..., None]).reshape(w.shape)
        data = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
        return QuantizedWeight(fmt, data, block, w.shape, dtype, global_scale=g)
    if fmt == "fp8_tensor":
        scale = _safe(np.abs(w).max(axis=(-2, -1)), 448.0)
        return QuantizedWeight(fmt, fp8_codes(w / scale[..., None, None]), scale, w.shape, dtype)
    if fmt == "fp8_channel":
        scale = _safe(np.abs(w).max(axis=-1), 448.0)
        return QuantizedWeight(fmt, fp8_codes(w / scale[..., None]), scale, w.shape, dtype)
    if fmt != "fp8_block":
        raise ValueError(f"unknown quantized format {fmt!r}; use one of {', '.join(FORMATS)}")
    bn, bk = block_size
    rows, cols = -(-n // bn), -(-k // bk)
    padded = np.zeros((*lead, rows * bn, cols * bk), np.float32)
    padded[..., :n, :k] = w
    amax = np.abs(padded.reshape(*lead, rows, bn, cols, bk)).max(axis=(-3, -1))
    scale = _safe(amax, 448.0)
    full = np.repeat(np.repeat(scale, bn, axis=-2), bk, axis=-1)[..., :n, :k]
    return QuantizedWeight(fmt, fp8_codes(w / full), scale, w.shape, dtype,
                           block_size=(bn, bk))
