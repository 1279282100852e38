"""NumPy references of the multi-head latent attention (MLA) ops.

The latent cache is one page pool ``[num_blocks, block_size, 1, kv_lora_rank + rope_dim]``
(:class:`~atlas_core.api.LatentCacheSpec`): per token the RMS-normed latent ``c`` then the
rotated decoupled rope key ``k_pe``; slot ``block * block_size + offset`` as for GQA pools.
Head ``h`` expands the latent with its rows of ``kv_b_proj.weight`` ``[num_heads * (nope_dim +
v_head_dim), kv_lora_rank]``: ``W_UK[h]`` (its first ``nope_dim`` rows) gives the key and
``W_UV[h]`` (the next ``v_head_dim``) the value. Prefill runs expanded (``kv_b_proj`` over the
gathered latents, then attention with 192-wide keys); decode runs absorbed: ``q_nope @ W_UK[h]``
is a query in latent space, attention reads the latent cache directly, ``W_UV[h]`` follows.
"""

from __future__ import annotations

import numpy as np

from atlas_core.api import QuantizedWeight, dequantize, f32, reference


def rope_rows(x: np.ndarray, positions: np.ndarray, cos_sin_cache: np.ndarray,
              is_neox: bool) -> np.ndarray:
    """Rotate the whole last axis of ``x`` ``[num_tokens, ..., rope_dim]`` (float32 result)."""
    half = x.shape[-1] // 2
    table = cos_sin_cache[np.asarray(positions, dtype=np.int64)]
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (half,)
    cos, sin = table[:, :half].reshape(shape), table[:, half:2 * half].reshape(shape)
    xf = f32(x)
    if is_neox:
        x1, x2 = xf[..., :half], xf[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    out = np.empty_like(xf)
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x2 * cos + x1 * sin
    return out


def llama4_attn_scale(positions: np.ndarray, beta: float, original: int) -> np.ndarray:
    """``1 + beta * log(1 + floor(pos / original))`` per token (float32; all ones for beta 0)."""
    pos = np.asarray(positions, dtype=np.float32)
    return (1.0 + np.float32(beta) * np.log1p(np.floor(pos / np.float32(original)))).astype(
        np.float32)


def mla_latent_cache(kv_a: np.ndarray, norm_weight: np.ndarray, eps: float,
                     positions: np.ndarray, cos_sin_cache: np.ndarray, cache: np.ndarray,
                     slot_mapping: np.ndarray, *, kv_lora_rank: int,
                     is_neox: bool = True) -> None:
    """Write each token's latent and rope key into the latent cache, in place.

    ``c = rms_norm(kv_a[:, :kv_lora_rank], norm_weight, eps)`` (rounded to ``kv_a.dtype``),
    ``k_pe = rope(kv_a[:, kv_lora_rank:])`` (rounded to ``kv_a.dtype``); the slot gets
    ``[c, k_pe]`` in the cache dtype.

    Args:
        kv_a: ``[num_tokens, kv_lora_rank + rope_dim]`` output of ``kv_a_proj_with_mqa``.
        norm_weight: ``[kv_lora_rank]`` weight of ``kv_a_layernorm``.
        eps: its epsilon.
        positions: ``[num_tokens]`` int32.
        cos_sin_cache: ``[max_position, rope_dim]`` float32 (cos half, sin half).
        cache: ``[num_blocks, block_size, 1, kv_lora_rank + rope_dim]``.
        slot_mapping: ``[num_tokens]`` int32; ``-1`` skips the token.
        kv_lora_rank: latent width.
        is_neox: rotate halves; else interleaved pairs (DeepSeek's ``rope_interleave``).
    """
    c = reference.rms_norm(kv_a[:, :kv_lora_rank], norm_weight, eps)
    k_pe = rope_rows(kv_a[:, kv_lora_rank:], positions, cos_sin_cache, is_neox).astype(kv_a.dtype)
    rows = np.concatenate([f32(c), f32(k_pe)], axis=-1)
    slots = np.asarray(slot_mapping, dtype=np.int64)
    keep = slots >= 0
    flat = cache.reshape(-1, cache.shape[-1])
    flat[slots[keep]] = rows[keep].astype(cache.dtype)


def mla_rope_query(q: np.ndarray, positions: np.ndarray, cos_sin_cache: np.ndarray, *,
                   nope_dim: int, is_neox: bool = True, attn_scale_beta: float = 0.0,
                   attn_scale_original: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Split the query heads, rotate their rope part, apply Llama-4 attention scaling.

    ``q_pe = rope(q[..., nope_dim:])`` (rounded to ``q.dtype``); with ``attn_scale_beta`` both
    parts are multiplied by :func:`llama4_attn_scale` of the token's position (Mistral-4,
    as HF ``get_llama_4_attn_scale``) and rounded again.

    Args:
        q: ``[num_tokens, num_heads, nope_dim + rope_dim]``.
        positions, cos_sin_cache, is_neox: as :func:`mla_latent_cache`.
        nope_dim: features without position (``qk_nope_head_dim``).
        attn_scale_beta, attn_scale_original: ``llama_4_scaling_beta`` and
            ``original_max_position_embeddings`` (beta 0: no scaling).

    Returns:
        ``(q_nope [num_tokens, num_heads, nope_dim], q_pe [num_tokens, num_heads, rope_dim])``
        contiguous, in ``q.dtype``.
    """
    q_nope = q[..., :nope_dim]
    q_pe = rope_rows(q[..., nope_dim:], positions, cos_sin_cache, is_neox).astype(q.dtype)
    if attn_scale_beta:
        scale = llama4_attn_scale(positions, attn_scale_beta, attn_scale_original)[:, None, None]
        q_nope, q_pe = f32(q_nope) * scale, f32(q_pe) * scale
    return (np.ascontiguousarray(q_nope).astype(q.dtype),
            np.ascontiguousarray(q_pe).astype(q.dtype))


def _head_blocks(kv_b_weight: np.ndarray, num_heads: int) -> np.ndarray:
    # [num_heads, nope_dim + v_head_dim, kv_lora_rank] float32
    w = dequantize(kv_b_weight) if isinstance(kv_b_weight, QuantizedWeight) else f32(kv_b_weight)
    return w.reshape(num_heads, -1, w.shape[-1])


def mla_absorb_query(q_nope: np.ndarray, kv_b_weight: np.ndarray) -> np.ndarray:
    """Fold ``W_UK`` into the query: ``q_lat[t, h] = q_nope[t, h] @ W_UK[h]``.

    Args:
        q_nope: ``[num_tokens, num_heads, nope_dim]``.
        kv_b_weight: ``[num_heads * (nope_dim + v_head_dim), kv_lora_rank]``.

    Returns:
        ``[num_tokens, num_heads, kv_lora_rank]`` in ``q_nope.dtype`` (float32 accumulation).
    """
    nope = q_nope.shape[-1]
    w_uk = _head_blocks(kv_b_weight, q_nope.shape[1])[:, :nope, :]
    return np.einsum("thn,hnc->thc", f32(q_nope), w_uk).astype(q_nope.dtype)


def mla_absorb_output(o_lat: np.ndarray, kv_b_weight: np.ndarray, v_head_dim: int) -> np.ndarray:
    """Apply ``W_UV`` after latent attention: ``out[t, h] = W_UV[h] @ o_lat[t, h]``.

    Args:
        o_lat: ``[num_tokens, num_heads, kv_lora_rank]``.
        kv_b_weight: ``[num_heads * (nope_dim + v_head_dim), kv_lora_rank]``.
        v_head_dim: value width per head (the last rows of each head's block).

    Returns:
        ``[num_tokens, num_heads, v_head_dim]`` in ``o_lat.dtype`` (float32 accumulation).
    """
    w_uv = _head_blocks(kv_b_weight, o_lat.shape[1])[:, -v_head_dim:, :]
    return np.einsum("thc,hvc->thv", f32(o_lat), w_uv).astype(o_lat.dtype)


def _causal_softmax(scores: np.ndarray, length: int) -> np.ndarray:
    # scores: [heads, n_q, length]; query i sits at position length - n_q + i
    return reference.causal_softmax(scores, np.arange(length - scores.shape[1], length))


def mla_absorbed_attention(q_lat: np.ndarray, q_pe: np.ndarray, cache: np.ndarray,
                           block_tables: np.ndarray, seq_lens: np.ndarray,
                           cu_seqlens_q: np.ndarray, scale: float) -> np.ndarray:
    """Causal attention in latent space over the paged latent cache (absorbed MLA).

    Every head reads the same cache rows (MQA): ``score = (q_lat . c + q_pe . k_pe) * scale``,
    ``out = softmax(score) @ c``. Query ``i`` of sequence ``b`` (``n_q`` rows) sits at position
    ``seq_lens[b] - n_q + i`` and sees cached tokens up to it (its own row already written).

    Args:
        q_lat: ``[num_tokens, num_heads, kv_lora_rank]`` (:func:`mla_absorb_query`).
        q_pe: ``[num_tokens, num_heads, rope_dim]``.
        cache: ``[num_blocks, block_size, 1, kv_lora_rank + rope_dim]``.
        block_tables: ``[num_seqs, max_blocks_per_seq]`` int32.
        seq_lens: ``[num_seqs]`` int32 context lengths including this step's tokens.
        cu_seqlens_q: ``[num_seqs + 1]`` int32 query-row prefix sums.
        scale: softmax scale.

    Returns:
        ``[num_tokens, num_heads, kv_lora_rank]`` in ``q_lat.dtype`` (float32 softmax).
    """
    rank = q_lat.shape[-1]
    out = np.zeros(q_lat.shape, dtype=np.float32)
    cu = np.asarray(cu_seqlens_q, dtype=np.int64)
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        if e == s:
            continue
        length = int(seq_lens[b])
        rows = reference.gather_kv(cache, block_tables[b], length)[:, 0, :]
        c, k_pe = rows[:, :rank], rows[:, rank:]
        scores = (np.einsum("qhc,kc->hqk", f32(q_lat[s:e]), c)
                  + np.einsum("qhr,kr->hqk", f32(q_pe[s:e]), k_pe)) * scale
        probs = _causal_softmax(scores, length)
        out[s:e] = np.einsum("hqk,kc->qhc", probs, c)
    return out.astype(q_lat.dtype)


def mla_gather_latent(cache: np.ndarray, block_tables: np.ndarray, seq_lens: np.ndarray,
                      num_ctx_tokens: int, kv_lora_rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Every sequence's cached latents, packed: sequence ``b`` owns rows ``sum(seq_lens[:b])``
    onwards (``seq_lens[b]`` of them).

    Args:
        cache, block_tables, seq_lens: as :func:`mla_absorbed_attention`.
        num_ctx_tokens: ``sum(seq_lens)`` (a host int: the output size).
        kv_lora_rank: latent width.

    Returns:
        ``(c [num_ctx_tokens, kv_lora_rank], k_pe [num_ctx_tokens, rope_dim])`` in the cache
        dtype.
    """
    rows = [reference.gather_kv(cache, block_tables[b], int(n))[:, 0, :].astype(cache.dtype)
            for b, n in enumerate(seq_lens)]
    packed = np.concatenate(rows) if rows else np.zeros((0, cache.shape[-1]), cache.dtype)
    if packed.shape[0] != num_ctx_tokens:
        raise ValueError(f"mla_gather_latent: num_ctx_tokens ({num_ctx_tokens}) must equal "
                         f"sum(seq_lens) ({packed.shape[0]})")
    return (np.ascontiguousarray(packed[:, :kv_lora_rank]),
            np.ascontiguousarray(packed[:, kv_lora_rank:]))


def mla_expanded_attention(q_nope: np.ndarray, q_pe: np.ndarray, kv: np.ndarray,
                           k_pe: np.ndarray, seq_lens: np.ndarray, cu_seqlens_q: np.ndarray,
                           scale: float) -> np.ndarray:
    """Causal attention with expanded keys and values (MLA prefill).

    Key of head ``h`` at context row ``j``: ``[kv[j, h, :nope_dim], k_pe[j]]``; value:
    ``kv[j, h, nope_dim:]``. Context rows are packed as :func:`mla_gather_latent` packs them;
    queries are placed as in :func:`mla_absorbed_attention`.

    Args:
        q_nope: ``[num_tokens, num_heads, nope_dim]``.
        q_pe: ``[num_tokens, num_heads, rope_dim]``.
        kv: ``[num_ctx_tokens, num_heads, nope_dim + v_head_dim]`` (``kv_b_proj`` output).
        k_pe: ``[num_ctx_tokens, rope_dim]``.
        seq_lens, cu_seqlens_q, scale: as :func:`mla_absorbed_attention`.

    Returns:
        ``[num_tokens, num_heads, v_head_dim]`` in ``q_nope.dtype`` (float32 softmax).
    """
    nope = q_nope.shape[-1]
    v_dim = kv.shape[-1] - nope
    out = np.zeros((q_nope.shape[0], q_nope.shape[1], v_dim), dtype=np.float32)
    cu = np.asarray(cu_seqlens_q, dtype=np.int64)
    start = 0
    for b in range(len(cu) - 1):
        s, e, length = cu[b], cu[b + 1], int(seq_lens[b])
        ctx = f32(kv[start:start + length])
        if e > s:
            scores = (np.einsum("qhn,khn->hqk", f32(q_nope[s:e]), ctx[..., :nope])
                      + np.einsum("qhr,kr->hqk", f32(q_pe[s:e]), f32(k_pe[start:start + length])))
            probs = _causal_softmax(scores * scale, length)
            out[s:e] = np.einsum("hqk,khv->qhv", probs, ctx[..., nope:])
        start += length
    return out.astype(q_nope.dtype)
