"""NumPy references of the vision-tower ops (registered by :mod:`atlas_qwen3vl.plugin`).

Every op computes in float32 and stores in its input's dtype, as HF transformers does on CPU.
"""

from __future__ import annotations

import math

import numpy as np

#: Queries whose scores one step of :func:`vision_attention` holds (per head, all keys).
QUERY_BLOCK = 512


def _f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis (``nn.LayerNorm``).

    Args:
        x: ``[num_tokens, hidden]``.
        weight, bias: ``[hidden]``.
        eps: variance epsilon.

    Returns:
        ``[num_tokens, hidden]`` in ``x.dtype``.
    """
    xf = _f32(x)
    mean = xf.mean(axis=-1, keepdims=True)
    var = ((xf - mean) ** 2).mean(axis=-1, keepdims=True)
    return ((xf - mean) / np.sqrt(var + eps) * _f32(weight) + _f32(bias)).astype(x.dtype)


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 in float64: |error| < 1.5e-7, below float32 rounding of GELU.
    a = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                           + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-a * a))


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    """GELU: exact (``"none"``, ``nn.GELU()``) or the tanh form (``"tanh"``,
    ``gelu_pytorch_tanh``).

    Args:
        x: any shape.
        approximate: ``"none"`` or ``"tanh"``.

    Returns:
        ``x``'s shape and dtype.
    """
    xf = _f32(x)
    if approximate == "tanh":
        inner = np.float32(math.sqrt(2.0 / math.pi)) * (xf + np.float32(0.044715) * xf ** 3)
        return (0.5 * xf * (1.0 + np.tanh(inner))).astype(x.dtype)
    if approximate != "none":
        raise ValueError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return (0.5 * xf * (1.0 + _erf(xf / math.sqrt(2.0)))).astype(np.float32).astype(x.dtype)


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def vision_attention(qkv: np.ndarray, cos_sin: np.ndarray, cu_seqlens: np.ndarray, scale: float,
                     *, num_heads: int, head_dim: int) -> np.ndarray:
    """Bidirectional attention of each image's patches with their 2D rotary (HF
    ``Qwen3VLVisionAttention`` after its ``qkv`` projection).

    Args:
        qkv: ``[num_tokens, 3 * num_heads * head_dim]``: q, k, v columns in that order.
        cos_sin: ``[num_tokens, head_dim]`` float32: each token's ``cos`` in the first half and
            ``sin`` in the second (half-width, applied NeoX style to the whole head).
        cu_seqlens: ``[num_images + 1]`` int32 prefix sums of the patches per image; tokens
            attend within their image only.
        scale: softmax scale (``head_dim ** -0.5``).
        num_heads, head_dim: heads and per-head size.

    Returns:
        ``[num_tokens, num_heads * head_dim]`` in ``qkv.dtype``.
    """
    t = qkv.shape[0]
    parts = qkv.reshape(t, 3, num_heads, head_dim)
    half = head_dim // 2
    table = _f32(cos_sin)
    cos = np.concatenate([table[:, :half]] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([table[:, half:]] * 2, axis=-1)[:, None, :]
    q = _rotate(_f32(parts[:, 0]), cos, sin).astype(qkv.dtype).astype(np.float32)
    k = _rotate(_f32(parts[:, 1]), cos, sin).astype(qkv.dtype).astype(np.float32)
    v = _f32(parts[:, 2])
    out = np.empty((t, num_heads, head_dim), np.float32)
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    for s, e in zip(cu[:-1], cu[1:]):
        # queries in blocks: a large image's full score matrix would not fit in memory
        for q0 in range(s, e, QUERY_BLOCK):
            q1 = min(e, q0 + QUERY_BLOCK)
            scores = np.einsum("qhd,khd->hqk", q[q0:q1], k[s:e]) * scale
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            probs = probs.astype(qkv.dtype).astype(np.float32)
            out[q0:q1] = np.einsum("hqk,khd->qhd", probs, v[s:e])
    return out.astype(qkv.dtype).reshape(t, num_heads * head_dim)


def interpolate_pos_embed(table: np.ndarray, indices: np.ndarray,
                          weights: np.ndarray) -> np.ndarray:
    """Bilinear resampling of a learned square position table to each patch:
    ``sum_j weights[i, j] * table[indices[i, j]]``.

    Args:
        table: ``[num_position_embeddings, hidden]``.
        indices: ``[num_tokens, 4]`` int32 rows of ``table``.
        weights: ``[num_tokens, 4]`` float32.

    Returns:
        ``[num_tokens, hidden]`` in ``table.dtype`` (float32 sum, rounded once).
    """
    rows = _f32(table[np.asarray(indices, dtype=np.int64)])
    return (rows * _f32(weights)[:, :, None]).sum(axis=1).astype(table.dtype)
