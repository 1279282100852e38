"""Contract cases of the vision-tower ops (``GpuBackendContract`` runs them on every backend
that has the op): ViT-sized rows, two images of different lengths in one attention batch."""

from __future__ import annotations

import numpy as np

from atlas_core.testing.contracts_cases import OpCase
from atlas_core.testing.contracts_ops import DTYPES, make_rng, randn

from atlas_qwen3vl.vision_layout import pos_embed_taps, rotary_cos_sin


def layer_norm_cases() -> list[OpCase]:
    """``[tokens, hidden]`` with an offset mean, in every dtype."""
    cases = []
    for dtype in DTYPES:
        rng = make_rng("layer_norm", dtype)
        x = (randn(rng, (9, 48), np.float32) + 2.0).astype(dtype)
        cases.append(OpCase(dtype, (x, randn(rng, (48,), dtype), randn(rng, (48,), dtype), 1e-6)))
    return cases


def gelu_cases() -> list[OpCase]:
    """Both forms (exact and tanh) over ``[-6, 6]``."""
    cases = []
    for dtype in DTYPES:
        rng = make_rng("gelu", dtype)
        for approximate in ("none", "tanh"):
            x = randn(rng, (7, 40), dtype, 3.0)
            cases.append(OpCase(f"{dtype}-{approximate}", (x, approximate)))
    return cases


def vision_attention_cases() -> list[OpCase]:
    """Two images of head_dim 16 (16 and 4 patches), and two at Qwen3-VL's head_dim 72 (64 and
    8 patches: cuda pads it to the tensor-core kernel's 80), rotary from their grids."""
    cases = []
    layouts = [("d16", [(1, 4, 4), (1, 2, 2)], 16), ("d72", [(1, 8, 8), (1, 2, 4)], 72)]
    for dtype in DTYPES:
        for label, grids, head_dim in layouts:
            rng = make_rng("vision_attention", dtype, label)
            cu = np.concatenate([[0], np.cumsum([np.prod(g) for g in grids])]).astype(np.int32)
            qkv = randn(rng, (int(cu[-1]), 3 * 2 * head_dim), dtype)
            cos_sin = rotary_cos_sin(grids, head_dim, 2, 10000.0)
            cases.append(OpCase(f"{dtype}-{label}", (qkv, cos_sin, cu, head_dim ** -0.5),
                                {"num_heads": 2, "head_dim": head_dim}))
    return cases


def interpolate_pos_embed_cases() -> list[OpCase]:
    """A 4 x 4 table resampled to a 6 x 4 and a 2 x 2 grid."""
    cases = []
    indices, weights = pos_embed_taps([(1, 6, 4), (1, 2, 2)], 4, 2)
    for dtype in DTYPES:
        rng = make_rng("interpolate_pos_embed", dtype)
        cases.append(OpCase(dtype, (randn(rng, (16, 24), dtype), indices, weights)))
    return cases
