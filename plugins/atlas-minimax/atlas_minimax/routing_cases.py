"""Contract cases of ``moe_route_biased`` (``OpSpec(cases=...)``); imported only by tests."""

from __future__ import annotations

import numpy as np

from atlas_core.testing.contracts_cases import OpCase
from atlas_core.testing.contracts_ops import DTYPES, make_rng, randn

#: (num_tokens, num_experts, top_k, bias scale): no bias, a bias that reorders the choice,
#: one that dominates it, and M2's 256 experts top-8.
SHAPES = ((5, 8, 2, 0.0), (7, 16, 4, 0.3), (3, 32, 8, 5.0), (2, 256, 8, 0.1))


def moe_route_biased_cases() -> list[OpCase]:
    """Every entry of :data:`SHAPES` in every contract dtype, renormalised or not."""
    cases = []
    for dtype in DTYPES:
        for tokens, experts, top_k, bias_scale in SHAPES:
            rng = make_rng("moe_route_biased", dtype, tokens, experts)
            logits = randn(rng, (tokens, experts), dtype, 2.0)
            bias = (bias_scale * rng.standard_normal(experts)).astype(np.float32)
            for renorm in (True, False):
                cases.append(OpCase(f"{dtype}-{tokens}x{experts}-top{top_k}-b{bias_scale:g}"
                                    f"-{'renorm' if renorm else 'raw'}",
                                    (logits, bias, top_k, renorm)))
    return cases
