"""``toy_softcap`` on the cuda backend: a launch of ``toy_softcap.cu``.

The cuda backend builds one :class:`ToyCudaOps` per backend instance with its op context
(``ctx.kernel`` compiles and loads a kernel through the NVRTC disk cache, ``ctx.out`` takes the
output from the step workspace, ``ctx.launch`` launches on the backend's stream) and puts the
bound method in its op table: ``backend.ops.toy_softcap(x, cap)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_toy.softcap import check_cap

#: Threads per block, and the most blocks one launch uses (a grid-stride loop covers the rest).
THREADS, MAX_BLOCKS = 256, 8192


class ToyCudaOps:
    """The Toy family's CUDA ops.

    Args:
        ctx: the cuda backend's op context (:class:`atlas_cuda.context.OpContext`).
    """

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def toy_softcap(self, x: Any, cap: float) -> Any:
        """``cap * tanh(x / cap)`` of a device array (see :func:`atlas_toy.softcap.toy_softcap`)."""
        check_cap(cap)
        out = self.ctx.out(x.shape, x.dtype)
        if x.size:
            kernel = self.ctx.kernel("toy_softcap", x.dtype, "toy_softcap")
            blocks = min(-(-x.size // THREADS), MAX_BLOCKS)
            self.ctx.launch(kernel, blocks, THREADS, out, x, np.float32(cap),
                            np.float32(1.0 / cap), np.int64(x.size))
        return out
