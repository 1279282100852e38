"""3D multimodal rotary positions (MRoPE) of Qwen3-VL / Qwen3.5, interleaved layout.

Text tokens advance one position on all three axes (temporal, height, width), so their rotary
is ordinary 1D rotary at that position. An image's ``grid_h/m x grid_w/m`` tokens share the
temporal position where the image starts and count rows and columns from it; the text after the
image resumes at ``start + max(grid_h, grid_w) / m``. A sequence's later tokens therefore sit at
``index + rope_delta`` with ``rope_delta = max_position + 1 - prompt_length`` (``<= 0``).

Rotary frequency ``j`` takes its angle from the height axis when ``j % 3 == 1`` and
``j < 3 * mrope_section[1]``, from the width axis when ``j % 3 == 2`` and ``j < 3 *
mrope_section[2]``, else from the temporal axis (HF ``recomposition_frequencies``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def image_positions(start: int, grid_thw: Sequence[int], merge_size: int) -> np.ndarray:
    """``[3, num_tokens]`` int64 (t, h, w) positions of one image's tokens placed at ``start``."""
    t, h, w = int(grid_thw[0]), int(grid_thw[1]) // merge_size, int(grid_thw[2]) // merge_size
    tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
    return np.stack([tt.ravel(), hh.ravel(), ww.ravel()]).astype(np.int64) + start


def prompt_positions(num_tokens: int, images: Sequence[tuple[int, Sequence[int]]],
                     merge_size: int) -> tuple[np.ndarray, int]:
    """3D positions of a prompt and its ``rope_delta``.

    Args:
        num_tokens: prompt length.
        images: ``(offset, grid_thw)`` per image, in prompt order: the image's placeholder
            tokens start at ``offset``.
        merge_size: the vision tower's spatial merge size.

    Returns:
        ``(positions [3, num_tokens] int64, rope_delta)``.
    """
    out = np.empty((3, num_tokens), np.int64)
    index = current = 0
    for offset, grid in images:
        n_text = offset - index
        out[:, index:offset] = np.arange(current, current + n_text)
        current += n_text
        pos = image_positions(current, grid, merge_size)
        out[:, offset:offset + pos.shape[1]] = pos
        index = offset + pos.shape[1]
        current += max(int(grid[1]), int(grid[2])) // merge_size
    out[:, index:] = np.arange(current, current + num_tokens - index)
    rope_delta = int(out.max()) + 1 - num_tokens if num_tokens else 0
    return out, rope_delta


def axis_of_frequency(num_freqs: int, mrope_section: Sequence[int]) -> np.ndarray:
    """``[num_freqs]`` int: the axis (0 t, 1 h, 2 w) each rotary frequency reads."""
    axis = np.zeros(num_freqs, np.int64)
    for dim in (1, 2):
        axis[dim:min(num_freqs, 3 * int(mrope_section[dim])):3] = dim
    return axis


def mrope_cos_sin(positions: np.ndarray, inv_freq: np.ndarray,
                  mrope_section: Sequence[int]) -> np.ndarray:
    """Rotary table rows ``[num_tokens, 2 * len(inv_freq)]`` float32 (cos half, sin half) for
    tokens at 3D ``positions`` ``[3, num_tokens]``, in the layout of
    :func:`atlas_core.api.rope_cos_sin_cache` rows."""
    inv = np.asarray(inv_freq, np.float32)
    axis = axis_of_frequency(len(inv), mrope_section)
    chosen = np.asarray(positions)[axis].T.astype(np.float32)  # [num_tokens, num_freqs]
    angles = chosen * inv[None, :]
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=-1).astype(np.float32)
