"""NumPy reference helpers shared by the recurrent (state-carrying) layers of model families:
Mamba-2 (atlas-nemotron-h) and Gated DeltaNet (atlas-qwen35). They are not core ops: each
family registers its own op specs (``mamba2_conv1d``, ``causal_conv1d``, ...) whose reference is
one of these functions.

State lives in per-sequence slots of pools a layer receives through ``bind_state``, e.g. the
conv state ``[num_slots, kernel_size - 1, dim]`` (the last inputs of the depthwise causal conv,
token-major like the activations). Sequence ``b`` of a step owns slot ``state_indices[b]``
(``-1``: padding row, state neither read nor written). It starts from a zero state when this
step holds its whole context (``seq_lens[b]`` equals its query count) and continues from its
slot otherwise; its final state is written back in place.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from atlas_core.ops._dtypes import f32
from atlas_core.ops.norm import ACTIVATIONS


def softplus(x: np.ndarray) -> np.ndarray:
    """``log(1 + exp(x))``, linear above 20 (torch's threshold)."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def state_runs(cu_seqlens: np.ndarray, seq_lens: np.ndarray,
               state_indices: np.ndarray) -> Iterator[tuple[int, int, int, bool]]:
    """Yield ``(start, end, slot, has_initial_state)`` for every sequence of the step."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    for b in range(len(cu) - 1):
        start, end, slot = int(cu[b]), int(cu[b + 1]), int(state_indices[b])
        yield start, end, slot, slot >= 0 and int(seq_lens[b]) > end - start


def causal_conv1d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
                  conv_states: np.ndarray, cu_seqlens: np.ndarray, seq_lens: np.ndarray,
                  state_indices: np.ndarray, activation: str | None = "silu") -> np.ndarray:
    """Depthwise causal conv1d over packed variable-length sequences, carrying conv state.

    For sequence ``b`` with inputs ``x_0..x_{n-1}`` and previous inputs ``s`` (its conv state,
    zeros when it starts here), ``xs = [s; x]`` and
    ``y_t = act(sum_i weight[:, i] * xs[t + i] + bias)``, ``i in 0..K-1``. The last ``K - 1``
    rows of ``xs`` become the new conv state (in place). Computed in float32.

    Args:
        x: ``[num_tokens, dim]`` packed by sequence.
        weight: ``[dim, kernel_size]`` (HF ``conv1d.weight`` ``[dim, 1, K]`` squeezed).
        bias: optional ``[dim]``.
        conv_states: ``[num_slots, kernel_size - 1, dim]`` pool, updated in place.
        cu_seqlens: ``[num_seqs + 1]`` int32 prefix sums of query counts.
        seq_lens: ``[num_seqs]`` int32 context length including this step's tokens.
        state_indices: ``[num_seqs]`` int32 slot of each sequence (``-1``: skip).
        activation: ``"silu"`` or ``None``.

    Returns:
        ``[num_tokens, dim]`` in ``x.dtype``.
    """
    k = weight.shape[-1]
    w = f32(weight)
    out = np.zeros(x.shape, dtype=np.float32)
    for start, end, slot, has_state in state_runs(cu_seqlens, seq_lens, state_indices):
        prev = f32(conv_states[slot]) if has_state else np.zeros((k - 1, x.shape[1]), np.float32)
        xs = np.concatenate([prev, f32(x[start:end])], axis=0)
        n = end - start
        y = sum(xs[i:i + n] * w[:, i] for i in range(k))
        out[start:end] = y + f32(bias) if bias is not None else y
        if slot >= 0:
            conv_states[slot] = xs[n:].astype(conv_states.dtype)
    if activation is not None:
        out = ACTIVATIONS[activation](out)
    return out.astype(x.dtype)


def causal_conv1d_update(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
                         conv_states: np.ndarray, seq_lens: np.ndarray, state_indices: np.ndarray,
                         activation: str | None = "silu") -> np.ndarray:
    """One decode step of :func:`causal_conv1d`: one new token per sequence.

    Args:
        x: ``[num_seqs, dim]``, row ``b`` the new token of sequence ``b``.
        weight, bias, conv_states, seq_lens, state_indices, activation: as :func:`causal_conv1d`
            (a sequence with ``seq_lens[b] == 1`` starts from zeros).

    Returns:
        ``[num_seqs, dim]`` in ``x.dtype``.
    """
    cu = np.arange(x.shape[0] + 1, dtype=np.int32)
    return causal_conv1d(x, weight, bias, conv_states, cu, seq_lens, state_indices, activation)
