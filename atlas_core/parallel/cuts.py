"""How one rank cuts one checkpoint tensor (a :class:`Cut`), and the matching cut of a quantized
weight's scale tensors.

A cut takes index ranges along one axis of the whole tensor and concatenates them: an even
split (``Cut(axis)``), an even split of each of several consecutive blocks (``blocks``: a fused
``[q, k, v]`` projection gives every rank its part of each), explicit ranges (``spans``: KV
heads replicated when fewer than ranks, a rank's experts), a range padded with zero rows
(``pad_to``: the last vocabulary shard), or zeros of the same shape (``zeros``: a row-parallel
bias that only rank 0 adds).

A quantized weight's scales follow its cut: FP8 block scales by block rows / columns (the cut
must fall on block boundaries), per-channel scales by rows, NVFP4 packed data by half columns
and its group scales by groups of 16; per-tensor and global scales are replicated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from atlas_core.ops.quant import NVFP4_GROUP_SIZE


class ShardingError(ValueError):
    """The model cannot be split this way (sizes not divisible, an unsupported layer or format)."""


@dataclass(frozen=True)
class Cut:
    """A rank's part of a tensor along ``axis`` (negative counts from the end).

    Attributes:
        axis: the axis cut.
        blocks: full sizes of consecutive blocks along ``axis``, each split evenly (None: the
            whole axis is one block).
        spans: explicit ``(start, stop)`` ranges instead of an even split.
        pad_to: length of the result along ``axis``, zero rows appended (one span only).
        zeros: the rank holds zeros of the tensor's shape (``axis`` unused).
    """

    axis: int = 0
    blocks: tuple[int, ...] | None = None
    spans: tuple[tuple[int, int], ...] | None = None
    pad_to: int | None = None
    zeros: bool = False

    def ranges(self, size: int, rank: int, world_size: int) -> list[tuple[int, int]]:
        """The ``(start, stop)`` ranges this rank takes of an axis of ``size``.

        Raises:
            ShardingError: the blocks do not add up to ``size`` or one does not divide.
        """
        if self.spans is not None:
            return [(a, min(b, size)) for a, b in self.spans]
        blocks = self.blocks or (size,)
        if sum(blocks) != size:
            raise ShardingError(f"blocks {list(blocks)} do not add up to the tensor's {size}")
        out, start = [], 0
        for block in blocks:
            if block % world_size:
                raise ShardingError(f"a block of {block} rows or columns does not split over "
                                    f"{world_size} GPUs")
            n = block // world_size
            out.append((start + rank * n, start + (rank + 1) * n))
            start += block
        return out

    def shape(self, full: tuple[int, ...], rank: int, world_size: int) -> tuple[int, ...]:
        """The shape of this rank's part of a tensor of shape ``full``."""
        if self.zeros:
            return tuple(full)
        axis = self.axis % len(full)
        length = self.pad_to or sum(b - a for a, b in self.ranges(full[axis], rank, world_size))
        return (*full[:axis], length, *full[axis + 1:])

    def take(self, array: np.ndarray, rank: int, world_size: int) -> np.ndarray:
        """This rank's part of ``array`` (a view where one range suffices)."""
        if self.zeros:
            return array if rank == 0 else np.zeros(array.shape, array.dtype)
        axis = self.axis % array.ndim
        index = [slice(None)] * array.ndim
        parts = []
        for a, b in self.ranges(array.shape[axis], rank, world_size):
            index[axis] = slice(a, b)
            parts.append(array[tuple(index)])
        out = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)
        if self.pad_to and out.shape[axis] < self.pad_to:
            pad = [(0, 0)] * array.ndim
            pad[axis] = (0, self.pad_to - out.shape[axis])
            out = np.pad(out, pad)
        return out

    def scaled(self, axis: int, factor: int, size: int, rank: int, world_size: int,
               what: str) -> "Cut":
        """The same ranges, at ``axis`` of another tensor whose every entry covers ``factor``
        entries of this one (block scales, packed nibbles); ``size`` is this tensor's extent.

        Raises:
            ShardingError: a range does not start and end on a multiple of ``factor`` (the
                message names ``what`` and the sizes that would).
        """
        spans = []
        for a, b in self.ranges(size, rank, world_size):
            if a % factor or (b % factor and b < size):
                raise ShardingError(
                    f"{what}: rows/columns {a}..{b} of {size} do not fall on {factor}-aligned "
                    f"boundaries, so the quantized weight cannot be split over {world_size} GPUs "
                    f"(each GPU's part of every block must be a multiple of {factor}); use a "
                    "smaller --tensor-parallel-size, or a bf16 checkpoint")
            spans.append((a // factor, -(-b // factor)))
        return Cut(axis, spans=tuple(spans))


def scale_cut(cut: Cut, kind: str, weight_shape: tuple[int, ...], scale_shape: tuple[int, ...],
              block_size: tuple[int, int], rank: int, world_size: int, name: str) -> Cut | None:
    """How a quantized weight's scale tensor is cut when the weight is cut by ``cut``.

    Args:
        cut: the weight's cut (over its logical ``[*lead, N, K]`` shape).
        kind: ``"fp8_block"``, ``"fp8_channel"``, ``"fp8_tensor"``, ``"nvfp4"`` (the group
            scales) or ``"replicated"`` (global and activation scales).
        weight_shape: the weight's logical shape.
        scale_shape: the scale tensor's shape.
        block_size: FP8 block shape.
        rank, world_size: the rank.
        name: the weight (for the error).

    Returns:
        The scale's cut, or None when every rank holds it whole.

    Raises:
        ShardingError: the cut does not fall on the scale's block boundaries.
    """
    if cut.zeros:
        raise ShardingError(f"{name}: a quantized bias cannot be split across GPUs")
    ndim = len(weight_shape)
    axis = cut.axis % ndim
    lead = ndim - 2
    if axis < lead:
        whole = len(scale_shape) <= axis or scale_shape[axis] == 1
        return None if whole else replace(cut, axis=axis)
    if kind in ("replicated", "fp8_tensor"):
        return None
    on_rows = axis == ndim - 2
    if kind == "fp8_channel":
        return replace(cut, axis=lead) if on_rows else None
    if kind == "fp8_block":
        factor = block_size[0] if on_rows else block_size[1]
        return cut.scaled(axis, factor, weight_shape[axis], rank, world_size,
                          f"{name} ({block_size[0]}x{block_size[1]} FP8 blocks)")
    if on_rows:
        return replace(cut, axis=axis)
    return cut.scaled(axis, NVFP4_GROUP_SIZE, weight_shape[axis], rank, world_size,
                      f"{name} (NVFP4 groups of {NVFP4_GROUP_SIZE})")


def packed_cut(cut: Cut, weight_shape: tuple[int, ...], rank: int, world_size: int,
               name: str) -> Cut:
    """The cut of NVFP4 packed data ``[*lead, N, K/2]`` for a weight cut by ``cut`` (two values
    a byte; a column cut is checked against whole groups by the group scales' cut)."""
    axis = cut.axis % len(weight_shape)
    if axis != len(weight_shape) - 1:
        return replace(cut, axis=axis)
    return cut.scaled(axis, 2, weight_shape[axis], rank, world_size, name)
