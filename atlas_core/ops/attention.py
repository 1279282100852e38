"""Reference attention ops: KV-cache write, prefill attention (causal or bidirectional),
paged attention.

KV pools are laid out ``[num_blocks, block_size, num_kv_heads, head_dim]``; token ``t`` of a
sequence lives in block ``block_table[t // block_size]`` at offset ``t % block_size``, i.e. slot
``block * block_size + offset``. GQA: query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)``.

Every op taking ``k_cache`` / ``v_cache`` also takes NVFP4 pools: a ``uint8`` cache IS
nvfp4-packed, ``[num_blocks, block_size, num_kv_heads, head_dim / 2 + head_dim / 16]``, written
and read by the exact rule of :mod:`atlas_core.ops.kv_quant` (``head_dim`` comes from the
other operands; ``kv_scale`` still divides on write and multiplies on read, 1.0 in the engine).
"""

from __future__ import annotations

import sys

import numpy as np

from atlas_core.ops._dtypes import f32
from atlas_core.ops.kv_quant import dequantize_kv_nvfp4, is_nvfp4_cache, quantize_kv_nvfp4
from atlas_core.ops.norm import rms_norm
from atlas_core.ops.rotary import rotary_embedding


def reshape_and_cache(k: np.ndarray, v: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                      slot_mapping: np.ndarray, kv_scale: float = 1.0) -> None:
    """Write new keys/values into their cache slots, in place.

    Args:
        k, v: ``[num_tokens, num_kv_heads, head_dim]``.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]`` (any storage dtype,
            fp8 included: values are stored as ``x / kv_scale``), or ``uint8`` nvfp4 pools
            ``[..., head_dim / 2 + head_dim / 16]``: each row is
            :func:`~atlas_core.ops.kv_quant.quantize_kv_nvfp4` of ``x / kv_scale``.
        slot_mapping: ``[num_tokens]`` int32 slot per token; ``-1`` skips the token.
    """
    num_blocks, block_size = k_cache.shape[:2]
    slots = np.asarray(slot_mapping, dtype=np.int64)
    keep = slots >= 0
    slots = slots[keep]
    flat_k = k_cache.reshape(num_blocks * block_size, *k_cache.shape[2:])
    flat_v = v_cache.reshape(num_blocks * block_size, *v_cache.shape[2:])
    for flat, x, cache in ((flat_k, k, k_cache), (flat_v, v, v_cache)):
        values = f32(x[keep]) / np.float32(kv_scale)
        flat[slots] = (quantize_kv_nvfp4(values) if is_nvfp4_cache(cache)
                       else values.astype(cache.dtype))


def causal_softmax(scores: np.ndarray, q_pos: np.ndarray) -> np.ndarray:
    """Causal softmax of attention scores: key ``j`` is hidden from query ``i`` when
    ``j > q_pos[i]``; the rest is a max-subtracted softmax over the key axis.

    Args:
        scores: ``[num_heads, n_q, n_kv]`` float32 (already scaled).
        q_pos: ``[n_q]`` position of each query among the keys.

    Returns:
        ``[num_heads, n_q, n_kv]`` float32 probabilities.
    """
    mask = np.arange(scores.shape[-1])[None, :] > q_pos[:, None]
    scores = np.where(mask[None], -np.inf, scores)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, scale: float) -> np.ndarray:
    # q: [n_q, num_heads, head_dim]; k, v: [n_kv, num_kv_heads, head_dim] (float32)
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    group = num_heads // num_kv_heads
    kh = np.repeat(k, group, axis=1)
    vh = np.repeat(v, group, axis=1)
    probs = causal_softmax(np.einsum("qhd,khd->hqk", q, kh) * scale, q_pos)
    return np.einsum("hqk,khd->qhd", probs, vh)


def prefill_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, cu_seqlens: np.ndarray,
                      scale: float, *, causal: bool = True) -> np.ndarray:
    """Self-attention over packed variable-length sequences (no cache): causal, or
    bidirectional within each sequence (``causal=False``: vision towers).

    Args:
        q: ``[num_tokens, num_heads, head_dim]``.
        k, v: ``[num_tokens, num_kv_heads, head_dim]``.
        cu_seqlens: ``[num_seqs + 1]`` int32 prefix sums of sequence lengths.
        scale: softmax scale, usually ``head_dim ** -0.5``.
        causal: token ``i`` of a sequence attends to its tokens ``0..i``; with ``False``, to
            all of them.

    Returns:
        ``[num_tokens, num_heads, head_dim]`` in ``q.dtype`` (float32 softmax and accumulation).
    """
    out = np.empty(q.shape, dtype=np.float32)
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        q_pos = np.arange(e - s) if causal else np.full(e - s, e - s - 1)
        out[s:e] = _attend(f32(q[s:e]), f32(k[s:e]), f32(v[s:e]), q_pos, scale)
    return out.astype(q.dtype)


def gather_kv(cache: np.ndarray, block_table: np.ndarray, length: int, kv_scale: float = 1.0) -> np.ndarray:
    """The first ``length`` cached tokens of one sequence as ``[length, num_kv_heads, head_dim]``
    float32 (an nvfp4 cache dequantized)."""
    block_size = cache.shape[1]
    num_blocks = -(-length // block_size)
    blocks = cache[np.asarray(block_table[:num_blocks], dtype=np.int64)]
    rows = blocks.reshape(-1, *cache.shape[2:])[:length]
    return (dequantize_kv_nvfp4(rows) if is_nvfp4_cache(cache) else f32(rows)) * kv_scale


def paged_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, block_tables: np.ndarray,
                    seq_lens: np.ndarray, cu_seqlens_q: np.ndarray, scale: float,
                    kv_scale: float = 1.0) -> np.ndarray:
    """Causal attention of new query tokens over each sequence's paged KV cache.

    Serves decode (one query per sequence), chunked prefill and prefix-cached prefill alike: the
    ``n_q`` queries of sequence ``b`` are its last ``n_q`` positions, ``seq_lens[b] - n_q + i``,
    and attend to cached tokens ``0..position`` (their own K/V must already be written).

    Args:
        q: ``[num_tokens, num_heads, head_dim]`` packed by sequence.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, or ``uint8``
            nvfp4 pools (read dequantized, see the module docstring).
        block_tables: ``[num_seqs, max_blocks_per_seq]`` int32 (unused entries arbitrary).
        seq_lens: ``[num_seqs]`` int32 context length including this step's tokens.
        cu_seqlens_q: ``[num_seqs + 1]`` int32 prefix sums of query counts.
        scale: softmax scale.
        kv_scale: dequantisation scale of the cache (fp8 KV).

    Returns:
        ``[num_tokens, num_heads, head_dim]`` in ``q.dtype``.
    """
    out = np.empty(q.shape, dtype=np.float32)
    cu = np.asarray(cu_seqlens_q, dtype=np.int64)
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        if e == s:
            continue
        length = int(seq_lens[b])
        k = gather_kv(k_cache, block_tables[b], length, kv_scale)
        v = gather_kv(v_cache, block_tables[b], length, kv_scale)
        q_pos = np.arange(length - (e - s), length)
        out[s:e] = _attend(f32(q[s:e]), k, v, q_pos, scale)
    return out.astype(q.dtype)


def qk_norm_rope_and_cache(qkv: np.ndarray, positions: np.ndarray, cos_sin_cache: np.ndarray,
                           k_cache: np.ndarray, v_cache: np.ndarray, slot_mapping: np.ndarray, *,
                           num_heads: int, num_kv_heads: int, head_dim: int,
                           q_norm: np.ndarray | None = None, k_norm: np.ndarray | None = None,
                           eps: float = 1e-6, rotary_dim: int | None = None, is_neox: bool = True,
                           kv_scale: float = 1.0, v_norm: np.ndarray | None = None,
                           k_eq_v: bool = False) -> np.ndarray:
    """Fused attention prologue: split QKV, per-head RMSNorm of q and k (and v), rotary, cache
    write.

    Args:
        qkv: ``[num_tokens, (num_heads + 2 * num_kv_heads) * head_dim]`` output of the fused
            QKV projection (q heads, then k heads, then v heads); with ``k_eq_v`` only q and k
            heads, ``[num_tokens, (num_heads + num_kv_heads) * head_dim]``.
        positions, cos_sin_cache, rotary_dim, is_neox: as :func:`rotary_embedding`.
        k_cache, v_cache, slot_mapping, kv_scale: as :func:`reshape_and_cache` (written in place).
        q_norm, k_norm: optional ``[head_dim]`` RMSNorm weights applied per head (Qwen3).
        v_norm: optional ``[head_dim]`` RMSNorm weight of the value heads (Gemma-4 passes ones:
            its value norm has no weight); values are never rotated.
        k_eq_v: the values are the key heads as projected (before ``k_norm`` and rotary;
            Gemma-4's full-attention layers).

    Returns:
        ``q``: ``[num_tokens, num_heads, head_dim]`` normed and rotated, ready for attention.
    """
    return compose_qk_norm_rope_and_cache(
        sys.modules[__name__], qkv, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
        num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, q_norm=q_norm,
        k_norm=k_norm, eps=eps, rotary_dim=rotary_dim, is_neox=is_neox, kv_scale=kv_scale,
        v_norm=v_norm, k_eq_v=k_eq_v)


def compose_qk_norm_rope_and_cache(ops, qkv, positions, cos_sin_cache, k_cache, v_cache,
                                   slot_mapping, *, num_heads, num_kv_heads, head_dim,
                                   q_norm=None, k_norm=None, eps=1e-6, rotary_dim=None,
                                   is_neox=True, kv_scale=1.0, v_norm=None, k_eq_v=False):
    """:func:`qk_norm_rope_and_cache` through the ``rms_norm``, ``rotary_embedding`` and
    ``reshape_and_cache`` of ``ops`` (the references, or a backend's ``backend.ops``)."""
    t = qkv.shape[0]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q = qkv[:, :q_size].reshape(t, num_heads, head_dim)
    k = qkv[:, q_size:q_size + kv_size].reshape(t, num_kv_heads, head_dim)
    v = k if k_eq_v else qkv[:, q_size + kv_size:].reshape(t, num_kv_heads, head_dim)
    if q_norm is not None:
        q = ops.rms_norm(q, q_norm, eps)
    if k_norm is not None:
        k = ops.rms_norm(k, k_norm, eps)
    if v_norm is not None:
        v = ops.rms_norm(v, v_norm, eps)
    q, k = ops.rotary_embedding(q, k, positions, cos_sin_cache, rotary_dim, is_neox)
    ops.reshape_and_cache(k, v, k_cache, v_cache, slot_mapping, kv_scale)
    return q


def compose_rope_cache_attention(ops, qkv, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
                                 block_tables, seq_lens, cu_seqlens_q, scale, kv_scale=1.0, *,
                                 num_heads, num_kv_heads, head_dim, q_norm=None, k_norm=None,
                                 eps=1e-6, rotary_dim=None, is_neox=True):
    """:func:`rope_cache_attention` as the two ops of ``ops`` (the references, or a backend's
    ``backend.ops``): ``qk_norm_rope_and_cache`` then ``paged_attention``."""
    q = ops.qk_norm_rope_and_cache(
        qkv, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, q_norm=q_norm, k_norm=k_norm, eps=eps,
        rotary_dim=rotary_dim, is_neox=is_neox, kv_scale=kv_scale)
    return ops.paged_attention(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale,
                               kv_scale)


def rope_cache_attention(qkv: np.ndarray, positions: np.ndarray, cos_sin_cache: np.ndarray,
                         k_cache: np.ndarray, v_cache: np.ndarray, slot_mapping: np.ndarray,
                         block_tables: np.ndarray, seq_lens: np.ndarray, cu_seqlens_q: np.ndarray,
                         scale: float, kv_scale: float = 1.0, *, num_heads: int, num_kv_heads: int,
                         head_dim: int, q_norm: np.ndarray | None = None,
                         k_norm: np.ndarray | None = None, eps: float = 1e-6,
                         rotary_dim: int | None = None, is_neox: bool = True) -> np.ndarray:
    """The attention prologue and paged attention as one op (backends may fuse them for decode):
    ``paged_attention(qk_norm_rope_and_cache(qkv, ...), k_cache, v_cache, ...)``.

    Rounds exactly as the two ops do: ``q`` is stored in ``qkv.dtype`` and the new keys/values
    in the cache dtype (``x / kv_scale``) before attention reads them. Each token's
    ``slot_mapping`` entry must be the cache slot of its own position in ``block_tables`` (as the
    model runner builds them), so that attention sees the key/value it just wrote.

    Args:
        qkv, positions, cos_sin_cache, slot_mapping, num_heads, num_kv_heads, head_dim, q_norm,
            k_norm, eps, rotary_dim, is_neox: as :func:`qk_norm_rope_and_cache`.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, written in place.
        block_tables, seq_lens, cu_seqlens_q, scale, kv_scale: as :func:`paged_attention`.

    Returns:
        ``[num_tokens, num_heads, head_dim]`` in ``qkv.dtype``.
    """
    return compose_rope_cache_attention(
        sys.modules[__name__], qkv, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
        block_tables, seq_lens, cu_seqlens_q, scale, kv_scale, num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, q_norm=q_norm, k_norm=k_norm, eps=eps,
        rotary_dim=rotary_dim, is_neox=is_neox)
