"""Rotary position embedding: cos/sin tables for the rope_scaling types in use, and the op."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from atlas_core.ops._dtypes import f32


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """Normalise a config's rope settings to one dict.

    Accepts both the classic ``rope_theta`` + ``rope_scaling`` fields and transformers 5's
    ``rope_parameters``. Returns ``{"rope_type", "rope_theta", "partial_rotary_factor", ...}``
    with the scaling fields (``factor``, ``original_max_position_embeddings``…) kept.
    """
    if "rope_type" in config and "rope_theta" in config and "partial_rotary_factor" in config:
        return dict(config)  # already normalised: calling this on its own output is a no-op
    params: dict[str, Any] = {}
    scaling = config.get("rope_scaling") or {}
    params.update(scaling)
    params.update(config.get("rope_parameters") or {})
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    params.setdefault("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    params["rope_type"] = rope_type
    return params


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(rotary_dim: int, params: dict[str, Any],
                  max_position_embeddings: int) -> tuple[np.ndarray, float]:
    """Inverse frequencies ``[rotary_dim // 2]`` (float64) and the attention scaling factor.

    Supports rope types ``default``, ``linear``, ``dynamic`` (as default within the trained
    context), ``llama3`` and ``yarn`` with the same formulas as HF transformers.
    """
    base = float(params["rope_theta"])
    rope_type = params["rope_type"]
    # Exponents and powers in float32 as HF does: float64 here shifts angles at large positions.
    exponents = np.arange(0, rotary_dim, 2, dtype=np.float32) / np.float32(rotary_dim)
    inv_freq = (1.0 / base ** exponents).astype(np.float64)
    if rope_type in ("default", "dynamic", "mrope"):
        return inv_freq, 1.0
    factor = float(params.get("factor", 1.0))
    if rope_type == "linear":
        return inv_freq / factor, 1.0
    if rope_type == "llama3":
        old_len = float(params["original_max_position_embeddings"])
        low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
        return np.where(medium, smoothed, scaled), 1.0
    if rope_type == "yarn":
        return _yarn_inv_freq(rotary_dim, base, factor, params, max_position_embeddings)
    raise ValueError(f"unsupported rope_type {rope_type!r}; supported: default, linear, dynamic, "
                     "llama3, yarn")


def _yarn_inv_freq(dim: int, base: float, factor: float, params: dict[str, Any],
                   max_position_embeddings: int) -> tuple[np.ndarray, float]:
    original = params.get("original_max_position_embeddings") or max_position_embeddings
    attention_factor = params.get("attention_factor")
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        return dim * math.log(original / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    # float32 throughout, as HF computes it (float64 shifts angles at large positions).
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    extrapolation_factor = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_factor) + (1.0 / pos_freqs) * extrapolation_factor
    return inv_freq.astype(np.float64), float(attention_factor)


def rope_cos_sin_cache(rotary_dim: int, max_position: int, params: dict[str, Any],
                       max_position_embeddings: int | None = None) -> np.ndarray:
    """Table ``[max_position, rotary_dim]`` float32: ``cos`` in the first half, ``sin`` in the second.

    Both halves are already multiplied by the rope type's attention factor (yarn's mscale).
    """
    inv_freq, attention_factor = rope_inv_freq(
        rotary_dim, params, max_position_embeddings or max_position)
    # HF computes the angles in float32; do the same so large positions round identically.
    angles = np.arange(max_position, dtype=np.float32)[:, None] * inv_freq.astype(np.float32)[None, :]
    cos = np.cos(angles) * attention_factor
    sin = np.sin(angles) * attention_factor
    return np.concatenate([cos, sin], axis=-1).astype(np.float32)


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, rotary_dim: int, is_neox: bool) -> np.ndarray:
    # x: [num_tokens, num_heads, head_dim]; cos/sin: [num_tokens, 1, rotary_dim // 2]
    xf = f32(x).copy()
    half = rotary_dim // 2
    if is_neox:
        x1, x2 = xf[..., :half].copy(), xf[..., half:rotary_dim].copy()
        xf[..., :half] = x1 * cos - x2 * sin
        xf[..., half:rotary_dim] = x2 * cos + x1 * sin
    else:
        x1, x2 = xf[..., 0:rotary_dim:2].copy(), xf[..., 1:rotary_dim:2].copy()
        xf[..., 0:rotary_dim:2] = x1 * cos - x2 * sin
        xf[..., 1:rotary_dim:2] = x2 * cos + x1 * sin
    return xf.astype(x.dtype)


def rotary_embedding(q: np.ndarray, k: np.ndarray, positions: np.ndarray, cos_sin_cache: np.ndarray,
                     rotary_dim: int | None = None, is_neox: bool = True):
    """Rotate the first ``rotary_dim`` features of every head of ``q`` and ``k``.

    Args:
        q: ``[num_tokens, num_heads, head_dim]``.
        k: ``[num_tokens, num_kv_heads, head_dim]``.
        positions: ``[num_tokens]`` int32 absolute positions.
        cos_sin_cache: ``[max_position, rotary_dim]`` float32 from :func:`rope_cos_sin_cache`.
        rotary_dim: features rotated per head (partial rotary); default ``head_dim``.
        is_neox: rotate halves (NeoX/HF ``rotate_half``) rather than interleaved pairs (GPT-J).

    Returns:
        ``(q_rot, k_rot)`` in the input dtypes; features past ``rotary_dim`` pass through.
    """
    rotary_dim = rotary_dim or q.shape[-1]
    half = rotary_dim // 2
    table = cos_sin_cache[np.asarray(positions, dtype=np.int64)]
    cos, sin = table[:, None, :half], table[:, None, half:rotary_dim]
    return _rotate(q, cos, sin, rotary_dim, is_neox), _rotate(k, cos, sin, rotary_dim, is_neox)
