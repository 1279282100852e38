"""NumPy references of the Gated DeltaNet ops (Qwen3-Next / Qwen3.5), registered as op specs by
:mod:`atlas_qwen35.plugin`.

Recurrent state lives in per-sequence slots of two pools a layer receives through
``bind_state``: the conv state ``[num_slots, kernel_size - 1, conv_dim]`` (the last inputs of the
causal conv, token-major like the activations) and the SSM state
``[num_slots, num_v_heads, head_k_dim, head_v_dim]`` float32. Sequence ``b`` of a step owns slot
``state_indices[b]`` (``-1``: padding row, state neither read nor written). A sequence starts
from a zero state when this step holds its whole context (``seq_lens[b]`` equals its query
count), and continues from its slot otherwise; its final state is written back in place.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from atlas_core.api import ACTIVATIONS, f32, reference

#: The depthwise causal conv1d (shared with atlas-nemotron-h's ``mamba2_conv1d``), the
#: per-sequence runs of a step (:func:`state_runs`) and ``softplus`` have one NumPy reference,
#: in core (:mod:`atlas_core.ops.recurrent`). The two families keep their own op specs and CUDA
#: kernels.
causal_conv1d = reference.causal_conv1d
causal_conv1d_update = reference.causal_conv1d_update
state_runs = reference.state_runs


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _split_qkv(qkv: np.ndarray, num_k_heads: int, num_v_heads: int, head_k_dim: int,
               head_v_dim: int, use_qk_l2norm: bool, scale: float | None):
    # qkv: [n, 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim] -> float32 [num_v_heads, n, d]
    n = qkv.shape[0]
    key_dim = num_k_heads * head_k_dim
    x = f32(qkv)
    q = x[:, :key_dim].reshape(n, num_k_heads, head_k_dim)
    k = x[:, key_dim:2 * key_dim].reshape(n, num_k_heads, head_k_dim)
    v = x[:, 2 * key_dim:].reshape(n, num_v_heads, head_v_dim)
    if use_qk_l2norm:
        q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + 1e-6)
        k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + 1e-6)
    group = num_v_heads // num_k_heads
    q = np.repeat(q, group, axis=1) * (head_k_dim ** -0.5 if scale is None else scale)
    k = np.repeat(k, group, axis=1)
    return q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2)


def _recurrent_run(q, k, v, g, beta, state):
    # q, k: [H, n, dk]; v: [H, n, dv]; g, beta: [H, n]; state: [H, dk, dv] (all float32)
    out = np.empty(v.shape, dtype=np.float32)
    for t in range(q.shape[1]):
        state = state * np.exp(g[:, t])[:, None, None]
        kv_mem = np.einsum("hkv,hk->hv", state, k[:, t])
        delta = (v[:, t] - kv_mem) * beta[:, t, None]
        state = state + k[:, t, :, None] * delta[:, None, :]
        out[:, t] = np.einsum("hkv,hk->hv", state, q[:, t])
    return out, state


def _chunked_run(q, k, v, g, beta, state, chunk_size):
    # Same shapes as _recurrent_run; the WY form of the delta rule, one chunk at a time.
    num_heads, n, _ = q.shape
    out = np.empty(v.shape, dtype=np.float32)
    for c0 in range(0, n, chunk_size):
        c1 = min(c0 + chunk_size, n)
        qc, kc, vc, bc = q[:, c0:c1], k[:, c0:c1], v[:, c0:c1], beta[:, c0:c1]
        gamma = np.cumsum(g[:, c0:c1], axis=-1)                 # [H, C] log decay since chunk start
        size = c1 - c0
        diff = gamma[:, :, None] - gamma[:, None, :]            # log(Gamma_i / Gamma_j)
        lower = np.tril(np.ones((size, size), dtype=bool))
        decay = np.exp(np.where(lower, diff, -np.inf))          # [H, C, C], zero above the diagonal
        strict = decay * ~np.eye(size, dtype=bool)
        a = (bc[:, :, None] * (kc @ kc.transpose(0, 2, 1))) * strict
        system = np.eye(size, dtype=np.float32)[None] + a       # unit lower triangular
        w_v = np.linalg.solve(system, bc[:, :, None] * vc)
        w_k = np.linalg.solve(system, (bc * np.exp(gamma))[:, :, None] * kc)
        u = w_v - w_k @ state                                    # values written to the state
        attn = (qc @ kc.transpose(0, 2, 1)) * decay
        out[:, c0:c1] = (np.exp(gamma)[:, :, None] * qc) @ state + attn @ u
        tail = np.exp(gamma[:, -1:] - gamma)[:, :, None] * kc
        state = np.exp(gamma[:, -1])[:, None, None] * state + tail.transpose(0, 2, 1) @ u
    return out, state


def _delta_rule(run, qkv, g, beta, ssm_states, cu_seqlens, seq_lens, state_indices, *,
                num_k_heads, num_v_heads, head_k_dim, head_v_dim, scale, use_qk_l2norm):
    out = np.zeros((qkv.shape[0], num_v_heads, head_v_dim), dtype=np.float32)
    for start, end, slot, has_state in state_runs(cu_seqlens, seq_lens, state_indices):
        if end == start:
            continue
        q, k, v = _split_qkv(qkv[start:end], num_k_heads, num_v_heads, head_k_dim, head_v_dim,
                             use_qk_l2norm, scale)
        state = (f32(ssm_states[slot]).copy() if has_state
                 else np.zeros((num_v_heads, head_k_dim, head_v_dim), np.float32))
        o, state = run(q, k, v, f32(g[start:end]).T, f32(beta[start:end]).T, state)
        out[start:end] = o.transpose(1, 0, 2)
        if slot >= 0:
            ssm_states[slot] = state.astype(ssm_states.dtype)
    return out.astype(qkv.dtype)


def gated_delta_rule_recurrent(qkv: np.ndarray, g: np.ndarray, beta: np.ndarray,
                               ssm_states: np.ndarray, cu_seqlens: np.ndarray, seq_lens: np.ndarray,
                               state_indices: np.ndarray, *, num_k_heads: int, num_v_heads: int,
                               head_k_dim: int, head_v_dim: int, scale: float | None = None,
                               use_qk_l2norm: bool = True) -> np.ndarray:
    """Gated delta rule, token by token (the decode form; any query counts allowed).

    Per value head ``h`` (its key head is ``h // (num_v_heads // num_k_heads)``), with ``q, k``
    L2-normalised (eps ``1e-6`` inside the root) when ``use_qk_l2norm``, ``q`` scaled by
    ``scale`` (default ``head_k_dim ** -0.5``) and state ``S`` ``[head_k_dim, head_v_dim]``::

        S = exp(g_t) * S
        S = S + k_t (beta_t * (v_t - S^T k_t))^T
        o_t = S^T q_t

    Args:
        qkv: ``[num_tokens, 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim]`` packed by
            sequence: all q heads, then all k heads, then all v heads (the conv output).
        g: ``[num_tokens, num_v_heads]`` float32 log decay (``<= 0``), see :func:`gdn_gating`.
        beta: ``[num_tokens, num_v_heads]`` float32 write strength in ``(0, 1)``.
        ssm_states: ``[num_slots, num_v_heads, head_k_dim, head_v_dim]`` pool (float32), updated
            in place with each sequence's final state.
        cu_seqlens, seq_lens, state_indices: as :func:`causal_conv1d`.

    Returns:
        ``[num_tokens, num_v_heads, head_v_dim]`` in ``qkv.dtype`` (float32 math).
    """
    return _delta_rule(_recurrent_run, qkv, g, beta, ssm_states, cu_seqlens, seq_lens,
                       state_indices, num_k_heads=num_k_heads, num_v_heads=num_v_heads,
                       head_k_dim=head_k_dim, head_v_dim=head_v_dim, scale=scale,
                       use_qk_l2norm=use_qk_l2norm)


def gated_delta_rule_chunked(qkv: np.ndarray, g: np.ndarray, beta: np.ndarray,
                             ssm_states: np.ndarray, cu_seqlens: np.ndarray, seq_lens: np.ndarray,
                             state_indices: np.ndarray, *, num_k_heads: int, num_v_heads: int,
                             head_k_dim: int, head_v_dim: int, scale: float | None = None,
                             use_qk_l2norm: bool = True, chunk_size: int = 64) -> np.ndarray:
    """Gated delta rule in chunked (WY) form, for prefill; equals :func:`gated_delta_rule_recurrent`.

    Within a chunk starting from state ``S0``, with ``G_i = exp(sum_{j<=i} g_j)`` and the
    strictly lower ``A_ij = beta_i (G_i / G_j) k_i.k_j``, the values written to the state are
    ``U = (I + A)^-1 (beta V - beta G K S0)``; outputs are ``O = (G Q) S0 + tril((Q K^T) G_i / G_j) U``
    and the next state ``G_C S0 + sum_j (G_C / G_j) k_j u_j^T``.

    Args:
        qkv, g, beta, ssm_states, cu_seqlens, seq_lens, state_indices, num_k_heads,
            num_v_heads, head_k_dim, head_v_dim, scale, use_qk_l2norm: as
            :func:`gated_delta_rule_recurrent`.
        chunk_size: tokens per chunk (affects rounding only).

    Returns:
        ``[num_tokens, num_v_heads, head_v_dim]`` in ``qkv.dtype``.
    """
    def run(q, k, v, g_, beta_, state):
        return _chunked_run(q, k, v, g_, beta_, state, chunk_size)

    return _delta_rule(run, qkv, g, beta, ssm_states, cu_seqlens, seq_lens, state_indices,
                       num_k_heads=num_k_heads, num_v_heads=num_v_heads, head_k_dim=head_k_dim,
                       head_v_dim=head_v_dim, scale=scale, use_qk_l2norm=use_qk_l2norm)


def gdn_gating(ba: np.ndarray, A_log: np.ndarray, dt_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gated DeltaNet decay and write strength from the ``b``/``a`` projections.

    ``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)`` in float32.

    Args:
        ba: ``[num_tokens, 2 * num_v_heads]``: ``b`` for every head, then ``a`` for every head.
        A_log: ``[num_v_heads]`` (any float dtype).
        dt_bias: ``[num_v_heads]``.

    Returns:
        ``(g, beta)``, each ``[num_tokens, num_v_heads]`` float32.
    """
    num_heads = ba.shape[-1] // 2
    x = f32(ba)
    beta = _sigmoid(x[:, :num_heads])
    g = -np.exp(f32(A_log)) * reference.softplus(x[:, num_heads:] + f32(dt_bias))
    return g.astype(np.float32), beta.astype(np.float32)


def rms_norm_gated(x: np.ndarray, gate: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """Gated RMSNorm of the GDN output: ``rms_norm(x) * weight * silu(gate)`` over the last axis.

    The weight is used as stored (not zero-centred). Computed in float32.

    Args:
        x: ``[..., d]``, e.g. ``[num_tokens, num_v_heads, head_v_dim]``.
        gate: same shape as ``x`` (the ``z`` projection).
        weight: ``[d]``.
        eps: variance epsilon.

    Returns:
        Same shape as ``x``, in ``x.dtype``.
    """
    xf = f32(x)
    y = xf / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + eps) * f32(weight)
    return (y * ACTIVATIONS["silu"](f32(gate))).astype(x.dtype)


def compose_gdn_decode(ops, qkv, z, ba, conv_weight, A_log, dt_bias, norm_weight, conv_states,
                       ssm_states, cu_seqlens, seq_lens, state_indices, *, num_k_heads,
                       num_v_heads, head_k_dim, head_v_dim, eps=1e-6):
    """:func:`gated_delta_rule_decode` as the separate ops of ``ops`` (the references or a
    backend's ``backend.ops``)."""
    x = ops.causal_conv1d_update(qkv, conv_weight, None, conv_states, seq_lens, state_indices)
    g, beta = ops.gdn_gating(ba, A_log, dt_bias)
    core = ops.gated_delta_rule_recurrent(x, g, beta, ssm_states, cu_seqlens, seq_lens,
                                          state_indices, num_k_heads=num_k_heads,
                                          num_v_heads=num_v_heads, head_k_dim=head_k_dim,
                                          head_v_dim=head_v_dim)
    return ops.rms_norm_gated(core, z.reshape(*core.shape), norm_weight, eps)


def gated_delta_rule_decode(qkv: np.ndarray, z: np.ndarray, ba: np.ndarray,
                            conv_weight: np.ndarray, A_log: np.ndarray, dt_bias: np.ndarray,
                            norm_weight: np.ndarray, conv_states: np.ndarray,
                            ssm_states: np.ndarray, cu_seqlens: np.ndarray, seq_lens: np.ndarray,
                            state_indices: np.ndarray, *, num_k_heads: int, num_v_heads: int,
                            head_k_dim: int, head_v_dim: int, eps: float = 1e-6) -> np.ndarray:
    """A Gated DeltaNet decode step between the input and output projections, as one op
    (backends may fuse it): ``causal_conv1d_update`` (silu, no bias) of ``qkv``, ``gdn_gating``
    of ``ba``, ``gated_delta_rule_recurrent`` (L2-normalised q/k, default scale), then
    ``rms_norm_gated`` with gate ``z``; every intermediate rounded as those ops round it.

    Args:
        qkv: ``[num_seqs, 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim]``, one new
            token per sequence (the projection before the conv).
        z: ``[num_seqs, num_v_heads * head_v_dim]`` output gate projection.
        ba: ``[num_seqs, 2 * num_v_heads]``.
        conv_weight: ``[conv_dim, kernel_size]``.
        A_log, dt_bias: ``[num_v_heads]``.
        norm_weight: ``[head_v_dim]``.
        conv_states, ssm_states: the layer's state pools, updated in place.
        cu_seqlens: ``[num_seqs + 1]`` query offsets of a decode step (``0, 1, ..., num_seqs``).
        seq_lens, state_indices: as :func:`causal_conv1d`.
        num_k_heads, num_v_heads, head_k_dim, head_v_dim: as :func:`gated_delta_rule_recurrent`.
        eps: epsilon of the gated norm.

    Returns:
        ``[num_seqs, num_v_heads, head_v_dim]`` in ``qkv.dtype``.
    """
    return compose_gdn_decode(_REFERENCE_OPS, qkv, z, ba, conv_weight, A_log, dt_bias,
                              norm_weight, conv_states, ssm_states, cu_seqlens, seq_lens,
                              state_indices, num_k_heads=num_k_heads, num_v_heads=num_v_heads,
                              head_k_dim=head_k_dim, head_v_dim=head_v_dim, eps=eps)


_REFERENCE_OPS = SimpleNamespace(causal_conv1d_update=causal_conv1d_update, gdn_gating=gdn_gating,
                                 gated_delta_rule_recurrent=gated_delta_rule_recurrent,
                                 rms_norm_gated=rms_norm_gated)
