"""Attention for the numpy backend: paged attention by a numba kernel, prefill by BLAS matmuls.

Same semantics as :mod:`atlas_core.ops.attention` (float32 softmax and accumulation, causal
mask unless ``causal=False``, GQA query head ``h`` reading KV head ``h // group``).
"""

from __future__ import annotations

import numpy as np

from atlas_core.backends.numpy_convert import as_codes, to_f32
from atlas_core.backends.numpy_kernels import paged_attention_kernel
from atlas_core.ops.kv_quant import dequantize_kv_nvfp4, is_nvfp4_cache


def _softmax_(scores: np.ndarray) -> np.ndarray:
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, scale: float) -> np.ndarray:
    """Causal attention of ``n`` queries at positions ``q_pos`` over ``L`` keys (all float32;
    ``q_pos`` of ``L - 1`` everywhere: bidirectional).

    Args:
        q: ``[n, num_heads, head_dim]``; k, v: ``[L, num_kv_heads, head_dim]``.
        q_pos: ``[n]`` position of each query; query ``i`` sees keys ``0..q_pos[i]``.

    Returns:
        ``[n, num_heads, head_dim]`` float32.
    """
    n, num_heads, head_dim = q.shape
    length, num_kv_heads = k.shape[0], k.shape[1]
    group = num_heads // num_kv_heads
    # qg: [num_kv_heads, group * n, head_dim]
    qg = q.reshape(n, num_kv_heads, group, head_dim).transpose(1, 2, 0, 3).reshape(
        num_kv_heads, group * n, head_dim)
    scores = np.matmul(qg, k.transpose(1, 2, 0)).reshape(num_kv_heads, group, n, length)
    scores *= scale
    if length > 1:
        mask = np.arange(length)[None, :] > np.asarray(q_pos)[:, None]
        if mask.any():
            scores[:, :, mask] = -np.inf
    probs = _softmax_(scores).reshape(num_kv_heads, group * n, length)
    out = np.matmul(probs, np.ascontiguousarray(v.transpose(1, 0, 2)))
    return out.reshape(num_kv_heads, group, n, head_dim).transpose(2, 0, 1, 3).reshape(
        n, num_heads, head_dim)


def prefill_attention(q, k, v, cu_seqlens, scale, *, causal=True):
    """Same contract as :func:`atlas_core.ops.reference.prefill_attention`."""
    out = np.empty(q.shape, dtype=np.float32)
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    qf, kf, vf = to_f32(q), to_f32(k), to_f32(v)
    for b in range(len(cu) - 1):
        s, e = int(cu[b]), int(cu[b + 1])
        if e > s:
            q_pos = np.arange(e - s) if causal else np.full(e - s, e - s - 1)
            out[s:e] = attend(qf[s:e], kf[s:e], vf[s:e], q_pos, scale)
    return out.astype(q.dtype, copy=False)


def _gather(cache: np.ndarray, tables: np.ndarray, kv_scale: float) -> np.ndarray:
    # tables: [..., num_blocks] -> [..., num_blocks * block_size, num_kv_heads, head_dim] float32
    blocks = to_f32(cache[tables])
    blocks = blocks.reshape(*tables.shape[:-1], -1, *cache.shape[2:])
    if kv_scale != 1.0:
        blocks *= np.float32(kv_scale)
    return blocks


def _paged_rows_numpy(q, k_cache, v_cache, block_tables, lens, cu, scale, kv_scale):
    # Without numba: one query row at a time over exactly the keys it sees (slow, but each row's
    # result is independent of the rest of the batch, like the kernel's).
    out = np.zeros(q.shape, dtype=np.float32)
    block_size = k_cache.shape[1]
    for b in range(len(cu) - 1):
        s, n, length = int(cu[b]), int(cu[b + 1] - cu[b]), int(lens[b])
        if n <= 0:
            continue
        table = np.asarray(block_tables[b][:-(-length // block_size)], dtype=np.int64)
        k = _gather(k_cache, table, kv_scale)
        v = _gather(v_cache, table, kv_scale)
        for i in range(n):
            pos = length - n + i
            out[s + i] = attend(q[s + i:s + i + 1], k[:pos + 1], v[:pos + 1], np.array([pos]),
                                scale)[0]
    return out


def _dequantized_blocks(k_cache, v_cache, block_tables, lens, cu):
    """float32 copies of just the nvfp4 blocks this step reads, and the block tables renumbered
    into them (the kernel then runs as over a float32 cache: same arithmetic per row)."""
    block_size = k_cache.shape[1]
    tables = np.asarray(block_tables, dtype=np.int64)
    used = [tables[b, :-(-int(lens[b]) // block_size)] for b in range(len(cu) - 1)
            if cu[b + 1] > cu[b] and lens[b] > 0]
    ids = np.unique(np.concatenate(used)) if used else np.zeros(1, np.int64)
    # entries past a sequence's blocks are never read: any in-range index will do
    local = np.searchsorted(ids, tables).clip(0, len(ids) - 1).astype(np.int32)
    pools = tuple(dequantize_kv_nvfp4(c[ids]) if is_nvfp4_cache(c) else to_f32(c[ids])
                  for c in (k_cache, v_cache))
    return pools[0], pools[1], local


def paged_attention(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale, kv_scale=1.0):
    """Same contract as :func:`atlas_core.ops.reference.paged_attention`.

    Batch invariant: a query row's result is the same bits whether its step is decode-only,
    mixed with prefill chunks, or a prefill chunk of any length (see ``docs/serving.md``).
    """
    cu = np.asarray(cu_seqlens_q, dtype=np.int64)
    lens = np.asarray(seq_lens, dtype=np.int64)
    qf = np.ascontiguousarray(to_f32(q))
    if is_nvfp4_cache(k_cache) or is_nvfp4_cache(v_cache):
        k_cache, v_cache, block_tables = _dequantized_blocks(k_cache, v_cache, block_tables, lens,
                                                             cu)
    k_codes, v_codes = as_codes(k_cache), as_codes(v_cache)
    if paged_attention_kernel is None or k_cache.dtype != v_cache.dtype or (
            k_codes is None and k_cache.dtype != np.float32):
        out = _paged_rows_numpy(qf, k_cache, v_cache, block_tables, lens, cu, scale, kv_scale)
        return out.astype(q.dtype, copy=False)
    out = np.zeros(q.shape, dtype=np.float32)
    k_src, v_src, lut = ((k_cache, v_cache, None) if k_codes is None
                         else (k_codes[0], v_codes[0], k_codes[1]))
    tables = np.ascontiguousarray(block_tables, dtype=np.int32)
    paged_attention_kernel(qf, k_src, v_src, lut, tables, lens, cu, np.float32(scale),
                           np.float32(kv_scale), out)
    return out.astype(q.dtype, copy=False)
