"""Contract-case helpers of the recurrent-state ops model families register (Mamba-2 in
atlas-nemotron-h, Gated DeltaNet in atlas-qwen35): step layouts, state pools and the depthwise
causal conv1d case (:func:`atlas_core.ops.recurrent.causal_conv1d`).

A layout is ``(num_q, context, slots)``: query rows per sequence, tokens cached before this
step, and state slots (``-1``: padding row). State pools start NaN-poisoned except the slots of
sequences that continue from earlier steps: an op must read only those, write every used slot
and leave the others NaN.
"""

from __future__ import annotations

import numpy as np

from atlas_core.testing.contracts_cases import OpCase
from atlas_core.testing.contracts_ops import DTYPES, make_rng, poisoned, randn

#: A mixed step: a prompt chunk continuing from its slot, a whole prompt, a padding row, a
#: whole prompt.
NUM_Q = [5, 20, 1, 9]
CONTEXT = [3, 0, 2, 0]
SLOTS = [4, 1, -1, 2]
MIXED = (NUM_Q, CONTEXT, SLOTS)
#: A decode step: one query row per sequence (a fresh one, a padding row).
DECODE = ([1] * 4, [6, 0, 3, 1], [0, 5, -1, 3])
#: The layouts by name, as case ids spell them.
LAYOUTS = {"mixed": MIXED, "decode": DECODE}
NUM_SLOTS = 6
#: State recurrences amplify rounding; their outputs get this much looser tolerance.
RECURRENT_TOL_SCALE = 10.0


def seq_layout(num_q, context, slots) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(cu_seqlens, seq_lens, state_indices)`` int32 arrays of a layout."""
    cu = np.concatenate([[0], np.cumsum(num_q)]).astype(np.int32)
    return cu, (np.array(num_q) + np.array(context)).astype(np.int32), np.array(slots, np.int32)


def state_pool(rng, shape, seq_lens, num_q, slots) -> np.ndarray:
    """A float32 pool of ``shape``, NaN everywhere except the slots a sequence continues from."""
    pool = poisoned(shape, "float32")
    for n_ctx, n_q, slot in zip(seq_lens, num_q, slots):
        if slot >= 0 and n_ctx > n_q:
            pool[slot] = rng.standard_normal(shape[1:]) * 0.5
    return pool


def decode_pools(rng, conv_shape, state_shape):
    """The :data:`DECODE` layout and both pools of a recurrent layer over it.

    Returns:
        ``((cu_seqlens, seq_lens, state_indices), (conv_pool, ssm_pool))``, the pools
        ``[NUM_SLOTS, *conv_shape]`` and ``[NUM_SLOTS, *state_shape]``.
    """
    cu, seq_lens, slots = seq_layout(*DECODE)
    pools = tuple(state_pool(rng, (NUM_SLOTS, *shape), seq_lens, DECODE[0], slots)
                  for shape in (conv_shape, state_shape))
    return (cu, seq_lens, slots), pools


def conv1d_args(rng, dtype, bias: bool, layout, dim: int = 40, kernel: int = 4):
    """Inputs of a conv1d op over ``layout``: ``(x, weight, bias, conv_states, cu_seqlens,
    seq_lens, state_indices)`` (``bias`` None unless asked for)."""
    cu, seq_lens, slots = seq_layout(*layout)
    pool = state_pool(rng, (NUM_SLOTS, kernel - 1, dim), seq_lens, layout[0], slots)
    x, w = randn(rng, (int(cu[-1]), dim), dtype), randn(rng, (dim, kernel), dtype, 0.5)
    b = randn(rng, (dim,), dtype) if bias else None
    return x, w, b, pool, cu, seq_lens, slots


def conv1d_cases(op: str) -> list[OpCase]:
    """Cases of a prefill conv1d op named ``op``: the :data:`MIXED` layout, with bias and silu
    and with neither, in every dtype."""
    cases = []
    for dtype in DTYPES:
        for bias, act in ((True, "silu"), (False, None)):
            args = conv1d_args(make_rng(op, dtype, bias, act), dtype, bias, MIXED)
            cases.append(OpCase(f"{dtype}-bias{int(bias)}-{act}", (*args, act)))
    return cases
