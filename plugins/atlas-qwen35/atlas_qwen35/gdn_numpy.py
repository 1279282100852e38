"""Gated delta rule on the numpy backend: one token-by-token numba kernel for both forms
(registered as the ``numpy`` implementations by :mod:`atlas_qwen35.plugin`).

``gated_delta_rule_chunked`` (prefill) and ``gated_delta_rule_recurrent`` (decode) both run the
recurrence token by token here. The chunked (WY) form rounds differently from the recurrent one
and its rounding depends on where chunks start, so with it a sequence's state would depend on
whether its tokens came in a decode-only step, a mixed step, or a prefill chunk cut wherever the
scheduler's token budget ran out. Token by token, the state after token ``t`` is the same bits
however the sequence was split into steps and whatever else ran beside it (batch invariance).
"""

from __future__ import annotations

import numpy as np

from atlas_qwen35 import gdn_reference as reference
from atlas_qwen35.gdn_reference import _split_qkv, state_runs

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency
    numba = None


def _delta_rule_rows(q, k, v, g, beta, states, slots, starts, ends, has_state, out):
    # q, k: [num_tokens, H, dk]; v, out: [num_tokens, H, dv]; g, beta: [num_tokens, H];
    # states: [num_slots, H, dk, dv] (all float32). Sums run over dk in order, lanes over dv.
    num_heads, dk, dv = k.shape[1], k.shape[2], v.shape[2]
    s = np.empty((dk, dv), dtype=np.float32)
    kv_mem = np.empty(dv, dtype=np.float32)
    delta = np.empty(dv, dtype=np.float32)
    o = np.empty(dv, dtype=np.float32)
    for b in range(len(starts)):
        slot = slots[b]
        for h in range(num_heads):
            if has_state[b]:
                s[:, :] = states[slot, h]
            else:
                s[:, :] = 0.0
            for t in range(starts[b], ends[b]):
                decay = np.exp(g[t, h])
                kv_mem[:] = 0.0
                for i in range(dk):
                    ki = k[t, h, i]
                    for j in range(dv):
                        s[i, j] *= decay
                        kv_mem[j] += s[i, j] * ki
                for j in range(dv):
                    delta[j] = (v[t, h, j] - kv_mem[j]) * beta[t, h]
                o[:] = 0.0
                for i in range(dk):
                    ki, qi = k[t, h, i], q[t, h, i]
                    for j in range(dv):
                        s[i, j] += ki * delta[j]
                        o[j] += s[i, j] * qi
                out[t, h, :] = o
            if slot >= 0:
                states[slot, h] = s


_delta_rule_jit = (numba.njit(cache=True, nogil=True)(_delta_rule_rows)
                   if numba is not None else None)


def _gated_delta_rule(qkv, g, beta, ssm_states, cu_seqlens, seq_lens, state_indices,
                      num_k_heads, num_v_heads, head_k_dim, head_v_dim, scale, use_qk_l2norm):
    if _delta_rule_jit is None or ssm_states.dtype != np.float32:
        return reference.gated_delta_rule_recurrent(
            qkv, g, beta, ssm_states, cu_seqlens, seq_lens, state_indices,
            num_k_heads=num_k_heads, num_v_heads=num_v_heads, head_k_dim=head_k_dim,
            head_v_dim=head_v_dim, scale=scale, use_qk_l2norm=use_qk_l2norm)
    runs = [r for r in state_runs(cu_seqlens, seq_lens, state_indices) if r[1] > r[0]]
    out = np.zeros((qkv.shape[0], num_v_heads, head_v_dim), dtype=np.float32)
    if runs:
        # q, k: [H, num_tokens, dk] -> [num_tokens, H, dk] (row-wise normalisation and scaling)
        q, k, v = (np.ascontiguousarray(a.transpose(1, 0, 2)) for a in _split_qkv(
            qkv, num_k_heads, num_v_heads, head_k_dim, head_v_dim, use_qk_l2norm, scale))
        starts, ends, slots, has_state = (np.array(col) for col in zip(*runs))
        _delta_rule_jit(q.astype(np.float32, copy=False), k.astype(np.float32, copy=False),
                        v, np.ascontiguousarray(g, dtype=np.float32),
                        np.ascontiguousarray(beta, dtype=np.float32), ssm_states,
                        slots.astype(np.int64), starts.astype(np.int64), ends.astype(np.int64),
                        has_state.astype(np.bool_), out)
    return out.astype(qkv.dtype)


def gated_delta_rule_recurrent(qkv, g, beta, ssm_states, cu_seqlens, seq_lens, state_indices, *,
                               num_k_heads, num_v_heads, head_k_dim, head_v_dim, scale=None,
                               use_qk_l2norm=True):
    """:func:`atlas_qwen35.gdn_reference.gated_delta_rule_recurrent` through the numba kernel."""
    return _gated_delta_rule(qkv, g, beta, ssm_states, cu_seqlens, seq_lens, state_indices,
                             num_k_heads, num_v_heads, head_k_dim, head_v_dim, scale,
                             use_qk_l2norm)


def gated_delta_rule_chunked(qkv, g, beta, ssm_states, cu_seqlens, seq_lens, state_indices, *,
                             num_k_heads, num_v_heads, head_k_dim, head_v_dim, scale=None,
                             use_qk_l2norm=True, chunk_size=64):
    """:func:`atlas_qwen35.gdn_reference.gated_delta_rule_chunked`, token by token (same result
    up to rounding; ``chunk_size`` does not apply)."""
    return _gated_delta_rule(qkv, g, beta, ssm_states, cu_seqlens, seq_lens, state_indices,
                             num_k_heads, num_v_heads, head_k_dim, head_v_dim, scale,
                             use_qk_l2norm)
