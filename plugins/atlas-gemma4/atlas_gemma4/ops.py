"""The ops Gemma-4 adds to the core set: NumPy references (also the numpy implementations).

- ``mul``: elementwise product with broadcasting (embedding scale, ``layer_scalar``, the
  router's per-expert scale).
- ``softcap``: ``cap * tanh(x / cap)`` (final logit soft-capping).
- ``sliding_window_attention``: :func:`paged_attention` where query position ``p`` sees only
  keys ``p - window + 1 .. p`` (HF ``sliding_window`` semantics); ``window`` 0 is the whole
  causal context (Gemma-4's full-attention layers: their 512-wide heads are past core
  ``paged_attention``'s cuda kernels).

- ``ffn_in``: the start of a block's feed-forward side as one op: the post-attention norm,
  the residual add and pre-feed-forward norm with the MLP's gate/up projection and activation,
  and the experts' input norm (:func:`ffn_in`), rounding as the separate core ops do.
- ``ffn_out``: the end of a block after its MLP (and experts) as one op: the post-feed-forward
  norms, the residual add and ``layer_scalar`` (:func:`ffn_out`), rounding as the separate
  core ops do.
- ``mul_gathered``: ``a * table[ids]`` (the router's per-expert scale of the chosen experts).

``ffn_in``, ``ffn_out`` and ``mul_gathered`` are defined over core ops and ``mul`` (their
references compose them; ``ffn_in``'s composition over a backend's table,
:func:`compose_ffn_in`, is its unfused definition, which the numpy backend runs); the others
have no unfused definition. The cuda implementations are in
:mod:`atlas_gemma4.cuda` (``atlas-gemma4[cuda]``). The loaders refuse a backend without them,
naming the missing ops, before anything is allocated.
"""

from __future__ import annotations

import numpy as np

from atlas_core.api import f32, reference


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise ``a * b`` in float32, stored in ``a.dtype``.

    Args:
        a: ``[..., d]``.
        b: broadcastable to ``a`` (``[1]``, ``[d]``, ``[..., 1]`` or ``a``'s shape).

    Returns:
        ``a.shape`` in ``a.dtype``.
    """
    return (f32(a) * f32(b)).astype(a.dtype)


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """``cap * tanh(x / cap)`` in float32, stored in ``x.dtype``.

    Args:
        x: any shape (logits ``[num_rows, vocab_size]``).
        cap: positive soft cap.
    """
    return (np.float32(cap) * np.tanh(f32(x) / np.float32(cap))).astype(x.dtype)


def sliding_window_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                             block_tables: np.ndarray, seq_lens: np.ndarray,
                             cu_seqlens_q: np.ndarray, scale: float, window: int,
                             kv_scale: float = 1.0) -> np.ndarray:
    """Causal paged attention limited to the last ``window`` positions.

    Same layout and arguments as ``paged_attention`` (the ``n_q`` queries of sequence ``b`` are
    its positions ``seq_lens[b] - n_q .. seq_lens[b] - 1``) plus ``window``: the query at
    position ``p`` attends to cached positions ``max(0, p - window + 1) .. p`` (``0 .. p`` when
    ``window`` is 0). Only blocks that hold those positions are read, so blocks wholly before
    the window may have been freed (their ``block_tables`` entries are ignored).

    Args:
        q: ``[num_tokens, num_heads, head_dim]`` packed by sequence.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: ``[num_seqs, max_blocks_per_seq]`` int32.
        seq_lens: ``[num_seqs]`` int32 context lengths including this step's tokens.
        cu_seqlens_q: ``[num_seqs + 1]`` int32 prefix sums of query counts.
        scale: softmax scale.
        window: window length, or 0 for none.
        kv_scale: dequantisation scale of the cache.

    Returns:
        ``[num_tokens, num_heads, head_dim]`` in ``q.dtype``.
    """
    out = np.zeros(q.shape, dtype=np.float32)
    block_size = k_cache.shape[1]
    cu = np.asarray(cu_seqlens_q, dtype=np.int64)
    group = q.shape[1] // k_cache.shape[2]
    for b in range(len(cu) - 1):
        s, e = int(cu[b]), int(cu[b + 1])
        if e == s:
            continue
        length = int(seq_lens[b])
        first = max(0, length - (e - s) - window + 1) if window > 0 else 0
        first_block = first // block_size
        table = np.asarray(block_tables[b], dtype=np.int64)[first_block:-(-length // block_size)]
        start = first_block * block_size
        k = f32(k_cache[table].reshape(-1, *k_cache.shape[2:])[:length - start]) * kv_scale
        v = f32(v_cache[table].reshape(-1, *v_cache.shape[2:])[:length - start]) * kv_scale
        kh, vh = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        q_pos = np.arange(length - (e - s), length)
        k_pos = np.arange(start, length)
        scores = np.einsum("qhd,khd->hqk", f32(q[s:e]), kh) * scale
        visible = k_pos[None, :] <= q_pos[:, None]
        if window > 0:
            visible &= k_pos[None, :] > q_pos[:, None] - window
        scores = np.where(visible[None], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out[s:e] = np.einsum("hqk,khd->qhd", probs, vh)
    return out.astype(q.dtype)


def ffn_in(attn: np.ndarray, hidden: np.ndarray, attn_weight: np.ndarray,
           pre_weight: np.ndarray, experts_weight: np.ndarray | None, eps: float,
           gate_up: np.ndarray, bias: np.ndarray | None = None, zero_centered: bool = False,
           activation: str | None = "gelu_tanh"):
    """The start of a Gemma block's feed-forward side, as the separate ops compute it:
    ``a = rms_norm(attn, attn_weight)`` (the post-attention norm), then
    ``act, h = rms_norm_linear(a, hidden, pre_weight, eps, gate_up, bias, zero_centered,
    activation)`` (the residual add, the pre-feed-forward norm and the MLP's gate/up with its
    activation) and, with ``experts_weight``, ``experts_in = rms_norm(h, experts_weight)`` (the
    routed experts' input); every step stored in ``attn.dtype``.

    Args:
        attn: ``[..., d]`` the attention's output.
        hidden: ``[..., d]`` the residual stream.
        attn_weight, pre_weight: ``[d]`` the post-attention and pre-feed-forward norms.
        experts_weight: ``[d]`` the experts' pre-norm (``pre_feedforward_layernorm_2``), or None
            (a dense block).
        eps: norm epsilon.
        gate_up: ``[2 * i, d]`` the MLP's gate rows then up rows (or a quantized weight).
        bias: optional ``[2 * i]``.
        zero_centered: norm weights stored as ``w - 1`` (Gemma-3).
        activation: ``"gelu_tanh"`` / ``"silu"``, or None: ``act`` is the plain projection
            ``[..., 2 * i]``.

    Returns:
        ``(act, h, experts_in)``: ``act`` ``[..., i]``, ``h`` the new residual stream
        ``a + hidden``, ``experts_in`` ``[..., d]`` or None without ``experts_weight``.
    """
    return compose_ffn_in(reference, attn, hidden, attn_weight, pre_weight, experts_weight, eps,
                          gate_up, bias, zero_centered, activation)


def compose_ffn_in(ops, attn, hidden, attn_weight, pre_weight, experts_weight, eps, gate_up,
                   bias=None, zero_centered=False, activation="gelu_tanh"):
    """:func:`ffn_in` as the separate ops of ``ops`` (the references, or a backend's
    ``backend.ops``): ``rms_norm``, ``rms_norm_linear``, ``rms_norm``."""
    attn = ops.rms_norm(attn, attn_weight, eps, zero_centered=zero_centered)
    act, h = ops.rms_norm_linear(attn, hidden, pre_weight, eps, gate_up, bias, zero_centered,
                                 activation)
    experts_in = None if experts_weight is None else ops.rms_norm(
        h, experts_weight, eps, zero_centered=zero_centered)
    return act, h, experts_in


def ffn_out(hidden: np.ndarray, ffn: np.ndarray, ffn_weight: np.ndarray | None,
            routed: np.ndarray | None, routed_weight: np.ndarray | None,
            post_weight: np.ndarray, scalar: np.ndarray | None, eps: float,
            zero_centered: bool = False) -> np.ndarray:
    """The end of a Gemma block after its feed-forward side, as the separate ops compute it:
    ``f = rms_norm(ffn, ffn_weight) + rms_norm(routed, routed_weight)`` with routed experts
    (``f = ffn`` without), then ``h = hidden + rms_norm(f, post_weight)``, times ``scalar``
    (``layer_scalar``) where given; every step stored in ``hidden.dtype``.

    Args:
        hidden: ``[..., d]`` the residual stream.
        ffn: ``[..., d]`` the dense MLP's output.
        ffn_weight, routed_weight: ``[d]`` the post-feed-forward norms 1 and 2 (with ``routed``).
        routed: ``[..., d]`` the routed experts' output, or None.
        post_weight: ``[d]`` the post-feed-forward norm.
        scalar: ``[1]`` or None.
        eps: norm epsilon.
        zero_centered: norm weights stored as ``w - 1`` (Gemma-3).
    """
    if routed is not None:
        ffn = reference.add(reference.rms_norm(ffn, ffn_weight, eps, zero_centered=zero_centered),
                            reference.rms_norm(routed, routed_weight, eps,
                                               zero_centered=zero_centered))
    h = reference.add(hidden, reference.rms_norm(ffn, post_weight, eps,
                                                 zero_centered=zero_centered))
    return h if scalar is None else mul(h, scalar)


def mul_gathered(a: np.ndarray, ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``a * table[ids]`` in float32, stored in ``a.dtype`` (``table`` is rounded to its own
    dtype first: it is a stored parameter).

    Args:
        a: any shape (the router's top-k weights ``[num_tokens, top_k]``, float32).
        ids: int32 of ``a``'s shape, indices into ``table``.
        table: ``[n]``.
    """
    return (f32(a) * f32(table.reshape(-1)[np.asarray(ids, dtype=np.int64)])).astype(a.dtype)
