"""Contract cases of the Gated DeltaNet ops, named by their op specs (:mod:`atlas_qwen35.plugin`).

The generated contract (:class:`atlas_core.testing.contracts_cases.GeneratedOpContract`, part of
every ``GpuBackendContract``) runs them on each backend that has the op. State pools start
NaN-poisoned except the slots of sequences that continue from earlier steps: an op must read
only those, write every used slot and leave the others NaN. Imported by tests only.
"""

from __future__ import annotations

import numpy as np

from atlas_core.testing.contracts_cases import OpCase
from atlas_core.testing.contracts_ops import DTYPES, make_rng, randn
from atlas_core.testing.recurrent_cases import (LAYOUTS, NUM_SLOTS, RECURRENT_TOL_SCALE,
                                                conv1d_args, conv1d_cases, decode_pools,
                                                seq_layout, state_pool)
from atlas_qwen35.gdn_reference import gdn_gating

#: (num_k_heads, num_v_heads, head_k_dim, head_v_dim).
DELTA_HEADS = [(2, 4, 16, 8), (1, 1, 32, 32)]
#: The conv decode step: one token per sequence, a padding row and a fresh sequence among them.
CONV_DECODE = ([1] * 4, [6, 0, 2, 1], [3, 0, -1, 5])


def causal_conv1d_cases() -> list[OpCase]:
    """Mixed prefill/decode layout, with and without bias and activation."""
    return conv1d_cases("causal_conv1d")


def causal_conv1d_update_cases() -> list[OpCase]:
    """One token per sequence, a padding row and a fresh sequence among them."""
    cases = []
    for dtype in DTYPES:
        x, w, b, pool, _, seq_lens, slots = conv1d_args(make_rng("causal_conv1d_update", dtype),
                                                        dtype, True, CONV_DECODE)
        cases.append(OpCase(dtype, (x, w, b, pool, seq_lens, slots, "silu")))
    return cases


def _delta_rule_cases(form: str) -> list[OpCase]:
    cases = []
    for dtype in DTYPES:
        for heads in DELTA_HEADS:
            for layout in ("mixed", "decode"):
                rng = make_rng("gated_delta_rule", dtype, form, heads, layout)
                num_k, num_v, dk, dv = heads
                num_q, context, slot_list = LAYOUTS[layout]
                cu, seq_lens, slots = seq_layout(num_q, context, slot_list)
                n = int(cu[-1])
                g, beta = gdn_gating(randn(rng, (n, 2 * num_v)),
                                     np.log(rng.uniform(0.5, 4, num_v)), randn(rng, (num_v,)))
                pool = state_pool(rng, (NUM_SLOTS, num_v, dk, dv), seq_lens, num_q, slots)
                kwargs = dict(num_k_heads=num_k, num_v_heads=num_v, head_k_dim=dk, head_v_dim=dv)
                if form == "chunked":
                    kwargs["chunk_size"] = 16
                args = (randn(rng, (n, 2 * num_k * dk + num_v * dv), dtype), g, beta, pool, cu,
                        seq_lens, slots)
                cases.append(OpCase(f"{dtype}-{'x'.join(map(str, heads))}-{layout}", args,
                                    kwargs, RECURRENT_TOL_SCALE))
    return cases


def gated_delta_rule_chunked_cases() -> list[OpCase]:
    """Mixed and decode layouts, grouped and single heads, 16-token chunks."""
    return _delta_rule_cases("chunked")


def gated_delta_rule_recurrent_cases() -> list[OpCase]:
    """Mixed and decode layouts, grouped and single heads."""
    return _delta_rule_cases("recurrent")


def gated_delta_rule_decode_case(dtype: str, heads: tuple[int, int, int, int]) -> OpCase:
    """A decode step of four sequences (a padding row, a fresh one) with both pools, for
    ``heads`` = ``(num_k_heads, num_v_heads, head_k_dim, head_v_dim)``."""
    rng = make_rng("gated_delta_rule_decode", dtype, heads)
    num_k, num_v, dk, dv = heads
    k, conv_dim = 4, 2 * num_k * dk + num_v * dv
    (cu, seq_lens, slots), pools = decode_pools(rng, (k - 1, conv_dim), (num_v, dk, dv))
    args = (randn(rng, (4, conv_dim), dtype), randn(rng, (4, num_v * dv), dtype),
            randn(rng, (4, 2 * num_v), dtype), randn(rng, (conv_dim, k), dtype, 0.5),
            np.log(rng.uniform(0.5, 4, num_v)).astype(np.float32),
            randn(rng, (num_v,)), randn(rng, (dv,), dtype), *pools, cu, seq_lens, slots)
    kwargs = dict(num_k_heads=num_k, num_v_heads=num_v, head_k_dim=dk, head_v_dim=dv)
    return OpCase(f"{dtype}-{'x'.join(map(str, heads))}", args, kwargs, RECURRENT_TOL_SCALE)


def gated_delta_rule_decode_cases() -> list[OpCase]:
    """Grouped and single heads, and the model's 128 x 128 heads."""
    return [gated_delta_rule_decode_case(dtype, heads)
            for dtype in DTYPES for heads in DELTA_HEADS + [(2, 4, 128, 128)]]


def gdn_gating_cases() -> list[OpCase]:
    """Large ``a`` values (softplus's linear branch) in every dtype."""
    cases = []
    for dtype in DTYPES:
        rng = make_rng("gdn_gating", dtype)
        cases.append(OpCase(dtype, (randn(rng, (9, 8), dtype, 3.0),
                                    np.log(rng.uniform(0.5, 8, 4)).astype(np.float32),
                                    randn(rng, (4,), dtype))))
    return cases


def rms_norm_gated_cases() -> list[OpCase]:
    """``[tokens, heads, head_v_dim]`` activations and gate."""
    cases = []
    for dtype in DTYPES:
        rng = make_rng("rms_norm_gated", dtype)
        cases.append(OpCase(dtype, (randn(rng, (7, 4, 32), dtype, 2.0),
                                    randn(rng, (7, 4, 32), dtype, 2.0), randn(rng, (32,), dtype),
                                    1e-6)))
    return cases
