"""Contract cases of this plugin's ops, named by their op specs (:mod:`atlas_nemotron_h.plugin`).

The generated contract (:class:`atlas_core.testing.contracts_cases.GeneratedOpContract`, part of
every ``GpuBackendContract``) runs them on each backend that has the op. State pools start
NaN-poisoned except the slots of sequences that continue from earlier steps: an op must read
only those, write every used slot and leave the others NaN. Imported by tests only.
"""

from __future__ import annotations

import numpy as np

from atlas_core.testing.contracts_cases import OpCase
from atlas_core.testing.contracts_ops import DTYPES, make_rng, randn
from atlas_core.testing.recurrent_cases import (DECODE, LAYOUTS, NUM_SLOTS, RECURRENT_TOL_SCALE,
                                                conv1d_args, conv1d_cases, decode_pools,
                                                seq_layout, state_pool)

#: (num_heads, head_dim, n_groups, state_size); the last is Nemotron-3 Nano's per-group shape.
SSM_SHAPES = [(4, 8, 2, 16), (2, 16, 1, 32), (8, 64, 1, 128)]
LIMITS = dict(dt_min=0.001, dt_max=float("inf"))


def mamba2_conv1d_cases() -> list[OpCase]:
    """Mixed prefill/decode layout, with and without bias and activation."""
    return conv1d_cases("mamba2_conv1d")


def mamba2_conv1d_update_cases() -> list[OpCase]:
    """One token per sequence, a padding row and a fresh sequence among them."""
    cases = []
    for dtype in DTYPES:
        x, w, b, pool, _, seq_lens, slots = conv1d_args(
            make_rng("mamba2_conv1d_update", dtype, True, "silu"), dtype, True, DECODE)
        cases.append(OpCase(dtype, (x, w, b, pool, seq_lens, slots, "silu")))
    return cases


def _ssm_inputs(rng, shape, n, dtype):
    heads, head_dim, groups, state = shape
    xbc = randn(rng, (n, heads * head_dim + 2 * groups * state), dtype)
    a_log = np.log(rng.uniform(0.5, 4, heads)).astype(np.float32)
    params = (randn(rng, (n, heads), dtype, 2.0), a_log, randn(rng, (heads,)),
              randn(rng, (heads,)))
    return xbc, params


def _scan_cases(form: str) -> list[OpCase]:
    cases = []
    for dtype in DTYPES:
        for shape in SSM_SHAPES[:2]:
            for layout in ("mixed", "decode"):
                rng = make_rng("mamba2_ssd", form, dtype, shape, layout)
                num_q, context, slot_list = LAYOUTS[layout]
                cu, seq_lens, slots = seq_layout(num_q, context, slot_list)
                xbc, (dt, a_log, dt_bias, d) = _ssm_inputs(rng, shape, int(cu[-1]), dtype)
                pool = state_pool(rng, (NUM_SLOTS, shape[0], shape[1], shape[3]), seq_lens, num_q,
                                  slots)
                kwargs = dict(num_heads=shape[0], head_dim=shape[1], n_groups=shape[2],
                              state_size=shape[3], **LIMITS)
                if form == "chunked":
                    kwargs["chunk_size"] = 8
                cases.append(OpCase(f"{dtype}-{'x'.join(map(str, shape))}-{layout}",
                                    (xbc, dt, a_log, dt_bias, d, pool, cu, seq_lens, slots),
                                    kwargs, RECURRENT_TOL_SCALE))
    return cases


def mamba2_ssd_chunked_cases() -> list[OpCase]:
    """Mixed and decode layouts, grouped and single-group heads, 8-token chunks."""
    return _scan_cases("chunked")


def mamba2_ssd_recurrent_cases() -> list[OpCase]:
    """Mixed and decode layouts, grouped and single-group heads."""
    return _scan_cases("recurrent")


def mamba2_decode_case(dtype: str, shape: tuple[int, int, int, int]) -> OpCase:
    """A decode step of four sequences (a padding row, a fresh one) with both pools."""
    rng = make_rng("mamba2_decode", dtype, shape)
    heads, head_dim, groups, state = shape
    k, inner = 4, heads * head_dim
    conv_dim = inner + 2 * groups * state
    (cu, seq_lens, slots), pools = decode_pools(rng, (k - 1, conv_dim), (heads, head_dim, state))
    xbc, (dt, a_log, dt_bias, d) = _ssm_inputs(rng, shape, 4, dtype)
    args = (xbc, randn(rng, (4, inner), dtype), dt, randn(rng, (conv_dim, k), dtype, 0.5),
            randn(rng, (conv_dim,), dtype), a_log, dt_bias, d, randn(rng, (inner,), dtype),
            *pools, cu, seq_lens, slots)
    kwargs = dict(num_heads=heads, head_dim=head_dim, n_groups=groups, state_size=state, **LIMITS)
    return OpCase(f"{dtype}-{'x'.join(map(str, shape))}", args, kwargs, RECURRENT_TOL_SCALE)


def mamba2_decode_cases() -> list[OpCase]:
    """Grouped and single-group heads, and Nemotron-3 Nano's 64 x 128 heads."""
    return [mamba2_decode_case(dtype, shape) for dtype in DTYPES for shape in SSM_SHAPES]


def mamba2_gated_norm_cases() -> list[OpCase]:
    """Two and eight groups, activations and gate of a few magnitudes."""
    cases = []
    for dtype in DTYPES:
        for groups in (2, 8):
            rng = make_rng("mamba2_gated_norm", dtype, groups)
            cases.append(OpCase(f"{dtype}-g{groups}", (
                randn(rng, (7, 128), dtype, 2.0), randn(rng, (7, 128), dtype, 2.0),
                randn(rng, (128,), dtype), 128 // groups, 1e-5)))
    return cases


def relu2_cases() -> list[OpCase]:
    """Both signs, in every dtype."""
    return [OpCase(dtype, (randn(make_rng("relu2", dtype), (9, 96), dtype, 2.0),))
            for dtype in DTYPES]


def nemotron_h_moe_route_cases() -> list[OpCase]:
    """One group (Nemotron-3 Nano) and two groups with one kept; a scaling factor. Decode
    batches of 1, 3 and 8 tokens over 128 experts (top-6, one group) and 64 experts in 8 groups
    (4 kept) at a hidden size of 1088; 11 tokens span two token
    tiles of the cuda logits kernel, a hidden size of 36 takes its scalar loads and one of 4160
    a second round of its vector loads (past the 4096 loaded before the PDL wait). Router rows
    are scaled by ``1 / sqrt(hidden)`` so the sigmoids stay off their flat ends (no near-ties)."""
    cases = []
    for dtype in DTYPES:
        for n_group, topk_group in ((1, 1), (4, 2)):
            rng = make_rng("nemotron_h_moe_route", dtype, n_group)
            cases.append(OpCase(f"{dtype}-g{n_group}", (
                randn(rng, (11, 32), dtype), randn(rng, (16, 32), "float32", 0.3),
                randn(rng, (16,), "float32", 0.2), 4, n_group, topk_group, True, 2.5)))
        for tokens in (1, 3, 8):
            for experts, n_group, topk_group in ((128, 1, 1), (64, 8, 4)):
                rng = make_rng("nemotron_h_moe_route", dtype, tokens, experts, "decode")
                cases.append(OpCase(f"{dtype}-t{tokens}-e{experts}g{n_group}", (
                    randn(rng, (tokens, 1088), dtype),
                    randn(rng, (experts, 1088), "float32", 1088 ** -0.5),
                    randn(rng, (experts,), "float32", 0.05), 6, n_group, topk_group, True, 2.5)))
        rng = make_rng("nemotron_h_moe_route", dtype, "scalar")
        cases.append(OpCase(f"{dtype}-h36", (
            randn(rng, (3, 36), dtype), randn(rng, (16, 36), "float32", 36 ** -0.5),
            randn(rng, (16,), "float32", 0.05), 4, 4, 2, False, 1.0)))
        rng = make_rng("nemotron_h_moe_route", dtype, "long")
        cases.append(OpCase(f"{dtype}-h4160", (
            randn(rng, (3, 4160), dtype), randn(rng, (16, 4160), "float32", 4160 ** -0.5),
            randn(rng, (16,), "float32", 0.05), 4, 1, 1, True, 1.0)))
    return cases


def nemotron_h_moe_experts_cases() -> list[OpCase]:
    """Top-2 of 8 experts over a handful of tokens; widths that are and are not multiples of 8
    (the cuda kernels' vector and scalar loads). Decode batches of 1, 3 and 8 tokens with top-8
    of 12 experts at widths that take two rounds of loads per lane in the cuda up and down
    GEMVs, and top-40 of 48 (more slots than the down kernel stages at once); 1, 3 and 8
    tokens with the shared expert (vector and scalar widths)."""
    cases = []
    for dtype in DTYPES:
        for width, inter in ((32, 24), (20, 12)):
            rng = make_rng("nemotron_h_moe_experts", dtype, width)
            ids = np.stack([rng.permutation(8)[:2] for _ in range(6)]).astype(np.int32)
            cases.append(OpCase(f"{dtype}-{width}x{inter}", (
                randn(rng, (6, width), dtype), randn(rng, (8, inter, width), dtype, 0.2),
                randn(rng, (8, width, inter), dtype, 0.2),
                rng.uniform(0.1, 1.0, (6, 2)).astype(np.float32), ids)))
        for tokens, experts, top_k, width, inter in ((1, 12, 8, 1032, 264), (3, 12, 8, 1032, 264),
                                                      (8, 12, 8, 1032, 264), (2, 48, 40, 16, 8)):
            rng = make_rng("nemotron_h_moe_experts", dtype, tokens, experts)
            ids = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)])
            cases.append(OpCase(f"{dtype}-t{tokens}-{experts}x{width}x{inter}", (
                randn(rng, (tokens, width), dtype),
                randn(rng, (experts, inter, width), dtype, width ** -0.5),
                randn(rng, (experts, width, inter), dtype, inter ** -0.5),
                rng.uniform(0.1, 1.0, (tokens, top_k)).astype(np.float32),
                ids.astype(np.int32))))
        for tokens, width, inter, s_inter in ((1, 264, 136, 272), (3, 264, 136, 272),
                                              (8, 264, 136, 272), (3, 20, 12, 28)):
            rng = make_rng("nemotron_h_moe_experts", dtype, tokens, width, "shared")
            ids = np.stack([rng.permutation(8)[:2] for _ in range(tokens)]).astype(np.int32)
            cases.append(OpCase(f"{dtype}-t{tokens}-{width}x{inter}-shared{s_inter}", (
                randn(rng, (tokens, width), dtype),
                randn(rng, (8, inter, width), dtype, width ** -0.5),
                randn(rng, (8, width, inter), dtype, inter ** -0.5),
                rng.uniform(0.1, 1.0, (tokens, 2)).astype(np.float32), ids,
                randn(rng, (s_inter, width), dtype, width ** -0.5),
                randn(rng, (width, s_inter), dtype, s_inter ** -0.5))))
    return cases
