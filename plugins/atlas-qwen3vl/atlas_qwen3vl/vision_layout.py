"""Host-side layout of a batch of images for the vision tower: each patch's (row, column) in
``merge x merge`` block order, its bilinear taps into the learned position table, and its 2D
rotary angles. Small integer/float tables computed once per batch, then uploaded."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def patch_rows_cols(grids: Sequence[Sequence[int]], merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Per patch of every image, its ``(row, col)`` in the patch grid, patches ordered by
    ``merge x merge`` block (the order the image processor emits them), frames repeated."""
    rows, cols = [], []
    for t, h, w in grids:
        hh, ww = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        shape = (h // merge, merge, w // merge, merge)
        r = hh.reshape(shape).transpose(0, 2, 1, 3).ravel()
        c = ww.reshape(shape).transpose(0, 2, 1, 3).ravel()
        rows.append(np.tile(r, t))
        cols.append(np.tile(c, t))
    return np.concatenate(rows), np.concatenate(cols)


def _axis_taps(index: np.ndarray, size: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray]:
    # align_corners=True: the first and last patch sit on the table's first and last entry.
    span = np.maximum(size - 1, 1).astype(np.float32)
    src = index.astype(np.float32) * np.float32(side - 1) / span
    floor = np.floor(src)
    offsets = np.arange(2)
    taps = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)
    weights = np.clip(1 - np.abs(src[:, None] - floor[:, None] - offsets), 0, None)
    return taps, weights.astype(np.float32)


def pos_embed_taps(grids: Sequence[Sequence[int]], num_grid: int,
                   merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear (``align_corners=True``) taps of every patch into the ``num_grid x num_grid``
    position table: ``(indices [N, 4] int32, weights [N, 4] float32)``."""
    rows, cols = patch_rows_cols(grids, merge)
    heights = np.concatenate([np.full(t * h * w, h) for t, h, w in grids])
    widths = np.concatenate([np.full(t * h * w, w) for t, h, w in grids])
    h_taps, h_w = _axis_taps(rows, heights, num_grid)
    w_taps, w_w = _axis_taps(cols, widths, num_grid)
    indices = (h_taps[:, :, None] * num_grid + w_taps[:, None, :]).reshape(-1, 4)
    weights = (h_w[:, :, None] * w_w[:, None, :]).reshape(-1, 4)
    return indices.astype(np.int32), weights.astype(np.float32)


def rotary_cos_sin(grids: Sequence[Sequence[int]], head_dim: int, merge: int,
                   theta: float) -> np.ndarray:
    """``[N, head_dim]`` float32 per patch: ``cos`` of its ``(row, col)`` angles in the first
    half, ``sin`` in the second; each half is the row angles then the column angles over
    ``head_dim / 4`` frequencies (HF ``Qwen3VLVisionRotaryEmbedding``)."""
    spatial = head_dim // 2
    inv_freq = 1.0 / (np.float32(theta) ** (np.arange(0, spatial, 2, dtype=np.float32) / spatial))
    inv_freq = inv_freq.astype(np.float32)
    rows, cols = patch_rows_cols(grids, merge)
    angles = np.concatenate([rows.astype(np.float32)[:, None] * inv_freq,
                             cols.astype(np.float32)[:, None] * inv_freq], axis=-1)
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=-1).astype(np.float32)
