"""Packing quantized checkpoint tensors into one model parameter, kept quantized.

A parameter viewed as rows ``[R, K]`` (``R = prod(shape[:-1])``) is filled by its sources in
order, each a contiguous run of rows (``q_proj``, ``k_proj``, ``v_proj`` of ``qkv_proj``; the
per-expert ``gate_proj`` / ``up_proj`` of a stacked ``experts.gate_up_proj``). Quantized data
concatenates along the rows exactly; the scales must too:

- FP8 per-tensor scales of several sources become per-channel ones (each row keeps its source's
  multiplier: exact); a single per-tensor source stays ``fp8_tensor``.
- FP8 block scales concatenate only when every source starts on a block-row boundary of its
  matrix; otherwise dequantizing and requantizing would change the values, so the parameter is
  dequantized at load instead (logged).
- NVFP4 block scales are per row and always concatenate; the global scale must be the same
  for every row of a matrix (ModelOpt and llm-compressor give fused q/k/v and gate/up one
  global scale), else the parameter is dequantized at load (logged).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from atlas_core.ops._dtypes import float8_e4m3fn
from atlas_core.ops.quant import QuantizedWeight, layout
from atlas_core.weights.checkpoint import Checkpoint
from atlas_core.weights.quant_tensors import QuantTensor, fp8_scale_kind, read_quantized


@dataclass(frozen=True)
class PackedLayout:
    """What a quantized parameter holds: its format, logical shape and block shape."""

    format: str
    shape: tuple[int, ...]
    block_size: tuple[int, int] | None

    def arrays(self) -> dict[str, tuple[tuple[int, ...], np.dtype] | None]:
        """``{"data" | "scale" | "global_scale": (shape, dtype) or None}`` to allocate."""
        shapes = layout(self.format, self.shape, self.block_size)
        fp8 = float8_e4m3fn
        dtypes = {"data": np.dtype(np.uint8) if self.format == "nvfp4" else fp8,
                  "scale": fp8 if self.format == "nvfp4" else np.dtype(np.float32),
                  "global_scale": np.dtype(np.float32)}
        return {k: None if s is None else (s, dtypes[k]) for k, s in shapes.items()}


def _row_starts(shapes: list[tuple[int, ...]]) -> list[int]:
    starts, row = [], 0
    for shape in shapes:
        starts.append(row)
        row += math.prod(shape[:-1])
    return starts


def decide_layout(checkpoint: Checkpoint, shape: tuple[int, ...],
                  sources: list[QuantTensor | None], block_size: tuple[int, int]
                  ) -> tuple[PackedLayout | None, str]:
    """The layout a parameter of ``shape`` filled by ``sources`` keeps, or ``(None, why)`` when
    it must be dequantized at load. Reads only headers and the (tiny) NVFP4 global scales."""
    if any(qt is None for qt in sources):
        return None, "its checkpoint tensors mix quantized and unquantized ones"
    kinds = {qt.kind for qt in sources}
    if len(kinds) > 1:
        return None, f"its checkpoint tensors mix formats ({', '.join(sorted(kinds))})"
    *_, n, k = shape
    if any(qt.shape[-1] != k for qt in sources):
        return None, "its checkpoint tensors do not share the input width"
    starts = _row_starts([qt.shape for qt in sources])
    if kinds == {"nvfp4"}:
        rows = _nvfp4_global_rows(checkpoint, sources).reshape(-1, n)
        if not (rows == rows[:, :1]).all():
            return None, "its NVFP4 tensors have different global scales (weight_scale_2)"
        return PackedLayout("nvfp4", shape, (1, 16)), ""
    scale_kinds = {fp8_scale_kind(checkpoint.shape(qt.scale), qt.shape, block_size)
                   for qt in sources}
    if "fp8_block" in scale_kinds:
        bn = block_size[0]
        if scale_kinds != {"fp8_block"}:
            return None, "its FP8 tensors mix block scales with per-tensor / per-channel ones"
        if any((start % n) % bn for start in starts):
            return None, (f"its FP8 tensors split the output rows off the {bn}-row scale blocks "
                          "(requantizing would change the weights)")
        return PackedLayout("fp8_block", shape, tuple(block_size)), ""
    if scale_kinds == {"fp8_tensor"} and len(sources) == 1:
        return PackedLayout("fp8_tensor", shape, None), ""
    return PackedLayout("fp8_channel", shape, None), ""


def _nvfp4_global_rows(checkpoint: Checkpoint, sources: list[QuantTensor]) -> np.ndarray:
    rows = []
    for qt in sources:
        g = np.asarray(checkpoint.get(qt.global_scale)).astype(np.float32)
        lead = qt.shape[:-2]
        g = np.broadcast_to(g.reshape(-1) if g.size > 1 else g.reshape(()), lead).reshape(-1)
        g = 1.0 / g if qt.global_inverted else g
        rows.append(np.repeat(g if g.size else g.reshape(1), qt.shape[-2]))
    return np.concatenate(rows).astype(np.float32)


def _row_scale(qw: QuantizedWeight) -> np.ndarray:
    n = qw.shape[-2]
    scale = np.asarray(qw.scale, dtype=np.float32)
    if qw.format == "fp8_tensor":
        return np.repeat(scale.reshape(-1), n)
    return scale.reshape(-1)


def pack_sources(checkpoint: Checkpoint, packed: PackedLayout, sources: list[QuantTensor],
                 dtype: np.dtype, block_size: tuple[int, int]) -> QuantizedWeight:
    """The host :class:`QuantizedWeight` of a parameter from its sources, in ``packed``'s
    layout (see :func:`decide_layout`)."""
    parts = [read_quantized(checkpoint, qt, dtype, block_size) for qt in sources]
    want = packed.arrays()
    if len(parts) == 1 and parts[0].format == packed.format:
        one = parts[0]
        return QuantizedWeight(packed.format, one.data.reshape(want["data"][0]),
                               np.asarray(one.scale).reshape(want["scale"][0]), packed.shape,
                               dtype, packed.block_size, _reshaped(one.global_scale, want),
                               one.input_scale)
    data = np.concatenate([np.asarray(p.data).reshape(-1, p.data.shape[-1]) for p in parts])
    if packed.format == "fp8_channel":
        scale = np.concatenate([_row_scale(p) for p in parts])
    else:
        scale = np.concatenate([np.asarray(p.scale).reshape(-1, p.scale.shape[-1])
                                for p in parts])
    global_scale = None
    if packed.format == "nvfp4":
        rows = np.concatenate([np.repeat(np.asarray(p.global_scale).reshape(-1), p.shape[-2])
                               for p in parts])
        global_scale = rows.reshape(-1, packed.shape[-2])[:, 0].reshape(want["global_scale"][0])
    inputs = [p.input_scale for p in parts if p.input_scale is not None]
    return QuantizedWeight(packed.format, data.reshape(want["data"][0]),
                           scale.reshape(want["scale"][0]), packed.shape, dtype,
                           packed.block_size, global_scale, max(inputs) if inputs else None)


def _reshaped(global_scale, want):
    if global_scale is None:
        return None
    return np.asarray(global_scale, dtype=np.float32).reshape(want["global_scale"][0])
