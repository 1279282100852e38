"""NumPy references of the Mamba-2 ops (Nemotron-H), registered as op specs by
:mod:`atlas_nemotron_h.plugin`.

A Mamba-2 layer keeps two per-sequence states in slots of pools it receives through
``bind_state``: the conv state ``[num_slots, conv_kernel - 1, conv_dim]`` (the last inputs of
the depthwise causal conv, token-major like the activations) and the SSM state
``[num_slots, num_heads, head_dim, state_size]`` float32 (HF's layout). Sequence ``b`` of a
step owns slot ``state_indices[b]`` (``-1``: padding row, state neither read nor written). A
sequence starts from a zero state when this step holds its whole context (``seq_lens[b]``
equals its query count) and continues from its slot otherwise; its final state is written
back in place.

The conv output ``xbc`` ``[num_tokens, conv_dim]`` holds, per token, the SSM input ``x``
(``num_heads * head_dim``), then ``B`` and ``C`` (``n_groups * state_size`` each); head ``h``
reads group ``h // (num_heads // n_groups)``.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from atlas_core.api import ACTIVATIONS, f32, reference

#: The conv1d ops are the depthwise causal conv1d that atlas-qwen35's Gated DeltaNet uses too
#: (``causal_conv1d``): one NumPy reference in core, :mod:`atlas_core.ops.recurrent`, which also
#: holds the per-sequence runs of a step (:func:`state_runs`) and ``softplus``. The two families
#: keep their own op specs and CUDA kernels.
mamba2_conv1d = reference.causal_conv1d
mamba2_conv1d_update = reference.causal_conv1d_update
state_runs = reference.state_runs
softplus = reference.softplus


def split_xbc(xbc: np.ndarray, num_heads: int, head_dim: int, n_groups: int, state_size: int):
    """float32 ``x [n, H, P]``, ``B`` and ``C`` ``[n, H, N]`` (each head's group repeated)."""
    n, inner, gn = xbc.shape[0], num_heads * head_dim, n_groups * state_size
    v = f32(xbc)
    x = v[:, :inner].reshape(n, num_heads, head_dim)
    rep = num_heads // n_groups
    b = np.repeat(v[:, inner:inner + gn].reshape(n, n_groups, state_size), rep, axis=1)
    c = np.repeat(v[:, inner + gn:inner + 2 * gn].reshape(n, n_groups, state_size), rep, axis=1)
    return x, b, c


def discretize(dt: np.ndarray, dt_bias: np.ndarray, dt_min: float, dt_max: float) -> np.ndarray:
    """``clip(softplus(dt + dt_bias), dt_min, dt_max)`` in float32 (``dt``: ``[n, H]``)."""
    return np.clip(softplus(f32(dt) + f32(dt_bias)), dt_min, dt_max).astype(np.float32)


def _recurrent_run(x, b, c, dt, a, state):
    # x: [n, H, P]; b, c: [n, H, N]; dt: [n, H]; a: [H]; state: [H, P, N] (float32)
    y = np.empty(x.shape, dtype=np.float32)
    for t in range(x.shape[0]):
        decay = np.exp(dt[t] * a)[:, None, None]
        state = state * decay + (dt[t][:, None] * b[t])[:, None, :] * x[t][:, :, None]
        y[t] = np.einsum("hpn,hn->hp", state, c[t])
    return y, state


def _chunked_run(x, b, c, dt, a, state, chunk_size):
    # The SSD block decomposition of one sequence, chunk by chunk (HF's mamba2_chunk_scan).
    y = np.empty(x.shape, dtype=np.float32)
    for c0 in range(0, x.shape[0], chunk_size):
        c1 = min(c0 + chunk_size, x.shape[0])
        xc, bc, cc = x[c0:c1], b[c0:c1], c[c0:c1]
        da = (dt[c0:c1] * a).T                                  # [H, L] log decay per token
        cum = np.cumsum(da, axis=-1)
        size = c1 - c0
        seg = cum[:, :, None] - cum[:, None, :]                 # [H, L, S]
        lower = np.tril(np.ones((size, size), dtype=bool))
        decay = np.exp(np.where(lower, seg, -np.inf))
        scores = np.einsum("lhn,shn->hls", cc, bc) * decay
        xdt = xc * dt[c0:c1][:, :, None]                        # [L, H, P]
        y_diag = np.einsum("hls,shp->lhp", scores, xdt)
        y_off = np.einsum("lhn,hpn->lhp", cc, state) * np.exp(cum).T[:, :, None]
        y[c0:c1] = y_diag + y_off
        tail = np.exp(cum[:, -1:] - cum)                        # [H, L]
        state = (np.exp(cum[:, -1])[:, None, None] * state
                 + np.einsum("lhn,hl,lhp->hpn", bc, tail, xdt))
    return y, state


def _scan(run, xbc, dt, A_log, dt_bias, D, ssm_states, cu_seqlens, seq_lens, state_indices, *,
          num_heads, head_dim, n_groups, state_size, dt_min, dt_max):
    a = -np.exp(f32(A_log))
    out = np.zeros((xbc.shape[0], num_heads, head_dim), dtype=np.float32)
    for start, end, slot, has_state in state_runs(cu_seqlens, seq_lens, state_indices):
        if end == start:
            continue
        x, b, c = split_xbc(xbc[start:end], num_heads, head_dim, n_groups, state_size)
        step = discretize(dt[start:end], dt_bias, dt_min, dt_max)
        state = (f32(ssm_states[slot]).copy() if has_state
                 else np.zeros((num_heads, head_dim, state_size), np.float32))
        y, state = run(x, b, c, step, a, state)
        out[start:end] = y + x * f32(D)[:, None]
        if slot >= 0:
            ssm_states[slot] = state.astype(ssm_states.dtype)
    return out.reshape(xbc.shape[0], num_heads * head_dim).astype(xbc.dtype)


def mamba2_ssd_recurrent(xbc: np.ndarray, dt: np.ndarray, A_log: np.ndarray, dt_bias: np.ndarray,
                         D: np.ndarray, ssm_states: np.ndarray, cu_seqlens: np.ndarray,
                         seq_lens: np.ndarray, state_indices: np.ndarray, *, num_heads: int,
                         head_dim: int, n_groups: int, state_size: int, dt_min: float = 0.0,
                         dt_max: float = float("inf")) -> np.ndarray:
    """The Mamba-2 selective scan token by token (the decode form; any query counts allowed).

    Per head ``h`` (group ``g = h // (num_heads // n_groups)``), with
    ``dt_t = clip(softplus(dt[t, h] + dt_bias[h]), dt_min, dt_max)``, ``A = -exp(A_log[h])``
    and state ``S`` ``[head_dim, state_size]``::

        S = exp(dt_t * A) * S + (dt_t * B_t[g]) x_t^T      (outer product, x_t: [head_dim])
        y_t = S C_t[g] + D[h] * x_t

    Args:
        xbc: ``[num_tokens, num_heads * head_dim + 2 * n_groups * state_size]`` packed by
            sequence: ``x``, ``B``, ``C`` (the conv output).
        dt: ``[num_tokens, num_heads]`` raw time steps (the ``dt`` rows of ``in_proj``).
        A_log, dt_bias, D: ``[num_heads]`` (float32 in checkpoints).
        ssm_states: ``[num_slots, num_heads, head_dim, state_size]`` pool (float32), updated in
            place with each sequence's final state.
        cu_seqlens, seq_lens, state_indices: as :func:`mamba2_conv1d`.
        num_heads, head_dim, n_groups, state_size: the layer's sizes.
        dt_min, dt_max: the time-step limits (``time_step_limit``).

    Returns:
        ``y`` ``[num_tokens, num_heads * head_dim]`` in ``xbc.dtype`` (float32 math).
    """
    return _scan(_recurrent_run, xbc, dt, A_log, dt_bias, D, ssm_states, cu_seqlens, seq_lens,
                 state_indices, num_heads=num_heads, head_dim=head_dim, n_groups=n_groups,
                 state_size=state_size, dt_min=dt_min, dt_max=dt_max)


def mamba2_ssd_chunked(xbc: np.ndarray, dt: np.ndarray, A_log: np.ndarray, dt_bias: np.ndarray,
                       D: np.ndarray, ssm_states: np.ndarray, cu_seqlens: np.ndarray,
                       seq_lens: np.ndarray, state_indices: np.ndarray, *, num_heads: int,
                       head_dim: int, n_groups: int, state_size: int, dt_min: float = 0.0,
                       dt_max: float = float("inf"), chunk_size: int = 128) -> np.ndarray:
    """The Mamba-2 scan in SSD chunked form, for prefill; equals :func:`mamba2_ssd_recurrent`.

    Within a chunk starting from state ``S0``, with ``a_t = dt_t * A``, ``cum_l`` the chunk's
    running sum of ``a`` and ``L_ls = exp(cum_l - cum_s)`` for ``s <= l`` (else 0):
    ``y_l = sum_s (C_l . B_s) L_ls dt_s x_s + exp(cum_l) S0 C_l`` and the next state is
    ``exp(cum_last) S0 + sum_s exp(cum_last - cum_s) dt_s x_s B_s^T``; then ``D`` skip.

    Args:
        xbc, dt, A_log, dt_bias, D, ssm_states, cu_seqlens, seq_lens, state_indices, num_heads,
            head_dim, n_groups, state_size, dt_min, dt_max: as :func:`mamba2_ssd_recurrent`.
        chunk_size: tokens per chunk (``chunk_size`` of config.json; affects rounding only).

    Returns:
        ``[num_tokens, num_heads * head_dim]`` in ``xbc.dtype``.
    """
    def run(x, b, c, step, a, state):
        return _chunked_run(x, b, c, step, a, state, chunk_size)

    return _scan(run, xbc, dt, A_log, dt_bias, D, ssm_states, cu_seqlens, seq_lens,
                 state_indices, num_heads=num_heads, head_dim=head_dim, n_groups=n_groups,
                 state_size=state_size, dt_min=dt_min, dt_max=dt_max)


def mamba2_gated_norm(y: np.ndarray, z: np.ndarray, weight: np.ndarray, group_size: int,
                      eps: float) -> np.ndarray:
    """Mamba-2's gated RMSNorm over groups (HF ``NemotronHRMSNormGated``, gate before norm).

    ``h = y * silu(z)`` in float32; each run of ``group_size`` features of ``h`` is divided by
    its root mean square (``+ eps`` inside the root); the result is rounded to ``y.dtype``, then
    multiplied by ``weight`` and rounded again.

    Args:
        y: ``[num_tokens, d]`` (the scan output), ``d`` a multiple of ``group_size``.
        z: ``[num_tokens, d]`` the gate (``z`` rows of ``in_proj``).
        weight: ``[d]``.
        group_size: ``d // n_groups``.
        eps: variance epsilon (``layer_norm_epsilon``).

    Returns:
        ``[num_tokens, d]`` in ``y.dtype``.
    """
    h = f32(y) * ACTIVATIONS["silu"](f32(z))
    g = h.reshape(h.shape[0], -1, group_size)
    normed = (g / np.sqrt(np.mean(g * g, axis=-1, keepdims=True) + eps)).reshape(h.shape)
    return (f32(normed.astype(y.dtype)) * f32(weight)).astype(y.dtype)


def compose_mamba2_decode(ops, xbc, z, dt, conv_weight, conv_bias, A_log, dt_bias, D,
                          norm_weight, conv_states, ssm_states, cu_seqlens, seq_lens,
                          state_indices, *, num_heads, head_dim, n_groups, state_size,
                          dt_min=0.0, dt_max=float("inf"), eps=1e-5):
    """:func:`mamba2_decode` as the separate ops of ``ops`` (the references or a backend's
    ``backend.ops``)."""
    x = ops.mamba2_conv1d_update(xbc, conv_weight, conv_bias, conv_states, seq_lens,
                                 state_indices)
    y = ops.mamba2_ssd_recurrent(x, dt, A_log, dt_bias, D, ssm_states, cu_seqlens, seq_lens,
                                 state_indices, num_heads=num_heads, head_dim=head_dim,
                                 n_groups=n_groups, state_size=state_size, dt_min=dt_min,
                                 dt_max=dt_max)
    return ops.mamba2_gated_norm(y, z, norm_weight, num_heads * head_dim // n_groups, eps)


def mamba2_decode(xbc: np.ndarray, z: np.ndarray, dt: np.ndarray, conv_weight: np.ndarray,
                  conv_bias: np.ndarray | None, A_log: np.ndarray, dt_bias: np.ndarray,
                  D: np.ndarray, norm_weight: np.ndarray, conv_states: np.ndarray,
                  ssm_states: np.ndarray, cu_seqlens: np.ndarray, seq_lens: np.ndarray,
                  state_indices: np.ndarray, *, num_heads: int, head_dim: int, n_groups: int,
                  state_size: int, dt_min: float = 0.0, dt_max: float = float("inf"),
                  eps: float = 1e-5) -> np.ndarray:
    """A Mamba-2 decode step between ``in_proj`` and ``out_proj`` as one op (backends may
    fuse it): ``mamba2_conv1d_update`` (silu) of ``xbc``, ``mamba2_ssd_recurrent``, then
    ``mamba2_gated_norm`` with gate ``z``; every intermediate rounded as those ops round it.

    Args:
        xbc: ``[num_seqs, conv_dim]`` one new token per sequence (before the conv).
        z: ``[num_seqs, num_heads * head_dim]``.
        dt: ``[num_seqs, num_heads]``.
        conv_weight, conv_bias: ``[conv_dim, kernel_size]``, optional ``[conv_dim]``.
        A_log, dt_bias, D: ``[num_heads]``.
        norm_weight: ``[num_heads * head_dim]``.
        conv_states, ssm_states: the layer's pools, updated in place.
        cu_seqlens: ``[num_seqs + 1]`` (``0, 1, ..., num_seqs``).
        seq_lens, state_indices: as :func:`mamba2_conv1d`.
        num_heads, head_dim, n_groups, state_size, dt_min, dt_max: as
            :func:`mamba2_ssd_recurrent`.
        eps: epsilon of the gated norm.

    Returns:
        ``[num_seqs, num_heads * head_dim]`` in ``xbc.dtype``.
    """
    return compose_mamba2_decode(_REFERENCE_OPS, xbc, z, dt, conv_weight, conv_bias, A_log,
                                 dt_bias, D, norm_weight, conv_states, ssm_states, cu_seqlens,
                                 seq_lens, state_indices, num_heads=num_heads, head_dim=head_dim,
                                 n_groups=n_groups, state_size=state_size, dt_min=dt_min,
                                 dt_max=dt_max, eps=eps)


_REFERENCE_OPS = SimpleNamespace(mamba2_conv1d_update=mamba2_conv1d_update,
                                 mamba2_ssd_recurrent=mamba2_ssd_recurrent,
                                 mamba2_gated_norm=mamba2_gated_norm)
