"""Contract cases of ``moe_route_biased`` (``OpSpec(cases=...)``); imported only by tests."""

from __future__ import annotations

import numpy as np

from atlas_core.testing.contracts_cases import OpCase
from atlas_core.testing.contracts_ops import DTYPES, make_rng, randn

#: (num_tokens, num_experts, top_k, bias scale): no bias, a bias that reorders the choice,
#: one that dominates it, M2's 256 experts top-8, a count that is no multiple of a warp, and the
#: largest the cuda kernel takes (1,024 experts top-32).
SHAPES = ((5, 8, 2, 0.0), (7, 16, 4, 0.3), (3, 32, 8, 5.0), (2, 256, 8, 0.1), (6, 40, 6, 0.3),
          (2, 1024, 32, 0.1))


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
    # ties: equal logits and no bias pick the lowest experts, in order
    for dtype in DTYPES:
        logits = np.zeros((3, 64), dtype=np.float32).astype(dtype)
        cases.append(OpCase(f"{dtype}-ties-3x64-top5", (logits, np.zeros(64, np.float32), 5,
                                                         True)))
    return cases
