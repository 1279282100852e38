"""Contract cases of ``moe_route_grouped`` (``OpSpec(cases=...)``); imported only by tests."""

from __future__ import annotations

import numpy as np

from atlas_core.testing.contracts_cases import OpCase
from atlas_core.testing.contracts_ops import DTYPES, make_rng, randn

#: (tokens, experts, top_k, groups, topk_groups, scoring, bias scale, scaling factor):
#: DeepSeek-V3 (256 experts, 8 groups top-4, top-8, sigmoid + bias, x2.5), Mistral-Small-4
#: (128 experts, softmax, no groups), a tiny grouped softmax, and no grouping with a bias.
SHAPES = ((5, 256, 8, 8, 4, "sigmoid", 0.1, 2.5), (4, 128, 4, 1, 1, "softmax", None, 1.0),
          (7, 8, 2, 4, 2, "softmax", None, 1.5), (3, 16, 4, 1, 1, "sigmoid", 0.5, 1.0))


def moe_route_grouped_cases() -> list[OpCase]:
    """Every entry of :data:`SHAPES` in every contract dtype, renormalised or not."""
    cases = []
    for dtype in DTYPES:
        for tokens, experts, top_k, groups, topk_groups, scoring, bias, factor in SHAPES:
            rng = make_rng("moe_route_grouped", dtype, tokens, experts, scoring)
            logits = randn(rng, (tokens, experts), dtype, 2.0)
            correction = (None if bias is None else
                          (bias * rng.standard_normal(experts)).astype(np.float32))
            for renorm in (True, False):
                cases.append(OpCase(
                    f"{dtype}-{tokens}x{experts}-top{top_k}-g{groups}/{topk_groups}-{scoring}"
                    f"-{'renorm' if renorm else 'raw'}",
                    (logits, correction, top_k, groups, topk_groups, scoring, renorm, factor)))
    return cases
