"""The Mamba-2 scan on the numpy backend: one token-by-token numba kernel for both forms
(registered as the ``numpy`` implementations by :mod:`atlas_nemotron_h.plugin`).

``mamba2_ssd_chunked`` (prefill) runs the recurrence token by token here, like
``mamba2_ssd_recurrent`` (decode). The chunked form rounds differently and its rounding depends
on where chunks start, so with it a sequence's state would depend on how the scheduler cut its
prompt and what ran beside it. Token by token, the state after token ``t`` is the same bits
however the sequence was split into steps (chunked prefill = one shot, mixed batch = alone).
"""

from __future__ import annotations

import numpy as np

from atlas_nemotron_h import mamba2_reference as reference
from atlas_nemotron_h.mamba2_reference import discretize, split_xbc, state_runs

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency of atlas-core
    numba = None


def _scan_rows(x, b, c, dt, a, d, states, slots, starts, ends, has_state, out):
    # x, out: [num_tokens, H, P]; b, c: [num_tokens, H, N]; dt: [num_tokens, H]; a, d: [H];
    # states: [num_slots, H, P, N] (all float32). Sums over N run in order.
    num_heads, head_dim, state_size = x.shape[1], x.shape[2], b.shape[2]
    s = np.empty((head_dim, state_size), dtype=np.float32)
    for q in range(len(starts)):
        slot = slots[q]
        for h in range(num_heads):
            if has_state[q]:
                s[:, :] = states[slot, h]
            else:
                s[:, :] = 0.0
            for t in range(starts[q], ends[q]):
                step = dt[t, h]
                decay = np.exp(step * a[h])
                for p in range(head_dim):
                    xv = x[t, h, p]
                    acc = np.float32(0.0)
                    for n in range(state_size):
                        s[p, n] = s[p, n] * decay + (step * b[t, h, n]) * xv
                        acc += s[p, n] * c[t, h, n]
                    out[t, h, p] = acc + d[h] * xv
            if slot >= 0:
                states[slot, h] = s


_scan_jit = numba.njit(cache=True, nogil=True)(_scan_rows) if numba is not None else None


def _scan(xbc, dt, A_log, dt_bias, D, ssm_states, cu_seqlens, seq_lens, state_indices, *,
          num_heads, head_dim, n_groups, state_size, dt_min, dt_max):
    if _scan_jit is None or ssm_states.dtype != np.float32:
        return reference.mamba2_ssd_recurrent(
            xbc, dt, A_log, dt_bias, D, ssm_states, cu_seqlens, seq_lens, state_indices,
            num_heads=num_heads, head_dim=head_dim, n_groups=n_groups, state_size=state_size,
            dt_min=dt_min, dt_max=dt_max)
    runs = [r for r in state_runs(cu_seqlens, seq_lens, state_indices) if r[1] > r[0]]
    out = np.zeros((xbc.shape[0], num_heads, head_dim), dtype=np.float32)
    if runs:
        x, b, c = (np.ascontiguousarray(v) for v in
                   split_xbc(xbc, num_heads, head_dim, n_groups, state_size))
        step = discretize(dt, dt_bias, dt_min, dt_max)
        a = (-np.exp(np.asarray(A_log, dtype=np.float32))).astype(np.float32)
        starts, ends, slots, has_state = (np.array(col) for col in zip(*runs))
        _scan_jit(x, b, c, step, a, np.asarray(D, dtype=np.float32), ssm_states,
                  slots.astype(np.int64), starts.astype(np.int64), ends.astype(np.int64),
                  has_state.astype(np.bool_), out)
    return out.reshape(xbc.shape[0], num_heads * head_dim).astype(xbc.dtype)


def mamba2_ssd_recurrent(xbc, dt, A_log, dt_bias, D, ssm_states, cu_seqlens, seq_lens,
                         state_indices, *, num_heads, head_dim, n_groups, state_size,
                         dt_min=0.0, dt_max=float("inf")):
    """:func:`atlas_nemotron_h.mamba2_reference.mamba2_ssd_recurrent` through the numba kernel."""
    return _scan(xbc, dt, A_log, dt_bias, D, ssm_states, cu_seqlens, seq_lens, state_indices,
                 num_heads=num_heads, head_dim=head_dim, n_groups=n_groups,
                 state_size=state_size, dt_min=dt_min, dt_max=dt_max)


def mamba2_ssd_chunked(xbc, dt, A_log, dt_bias, D, ssm_states, cu_seqlens, seq_lens,
                       state_indices, *, num_heads, head_dim, n_groups, state_size, dt_min=0.0,
                       dt_max=float("inf"), chunk_size=128):
    """:func:`atlas_nemotron_h.mamba2_reference.mamba2_ssd_chunked`, token by token (same result
    up to rounding; ``chunk_size`` does not apply)."""
    return _scan(xbc, dt, A_log, dt_bias, D, ssm_states, cu_seqlens, seq_lens, state_indices,
                 num_heads=num_heads, head_dim=head_dim, n_groups=n_groups,
                 state_size=state_size, dt_min=dt_min, dt_max=dt_max)
