"""``moe_route_biased`` on the cuda backend: a launch of ``moe_route_biased.cu``.

The cuda backend builds one :class:`MiniMaxCudaOps` per backend with its op context
(``ctx.kernel`` compiles through the NVRTC disk cache, ``ctx.out`` takes outputs from the step
workspace, ``ctx.launch`` launches on the backend's stream).
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Tokens per block (a warp per token; ROUTE_WARPS in the kernel).
TOKENS_PER_BLOCK = 4


class MiniMaxCudaOps:
    """The MiniMax family's CUDA ops.

    Args:
        ctx: the cuda backend's op context (:class:`atlas_cuda.context.OpContext`).
    """

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def moe_route_biased(self, router_logits: Any, correction_bias: Any, top_k: int,
                         renormalize: bool = True) -> tuple[Any, Any]:
        """See :func:`atlas_minimax.routing.moe_route_biased`."""
        t, e = router_logits.shape
        if e > 1024 or not 0 < top_k <= min(32, e):
            raise ValueError(f"moe_route_biased: at most 1024 experts and top_k between 1 and "
                             f"min(32, experts) on cuda (got {e} experts, top_k {top_k})")
        bias = self.ctx.f32(correction_bias)
        weights = self.ctx.out((t, top_k), np.float32)
        ids = self.ctx.out((t, top_k), np.int32)
        if t:
            kernel = self.ctx.kernel("moe_route_biased", router_logits.dtype, "moe_route_biased")
            self.ctx.launch(kernel, -(-t // TOKENS_PER_BLOCK), 32 * TOKENS_PER_BLOCK, weights, ids,
                            router_logits, bias, np.int32(t), np.int32(e), np.int32(top_k),
                            np.int32(int(renormalize)), pdl=self.ctx.pdl)
        return weights, ids
