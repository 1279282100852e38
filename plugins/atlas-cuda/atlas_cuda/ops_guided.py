"""Guided-decoding op of the cuda backend (``kernels/cuda/common/guided.cu``)."""

from __future__ import annotations

import numpy as np

from atlas_cuda.array import DeviceArray
from atlas_cuda.context import OpContext


class GuidedOps:
    """The guided-decoding mask op.

    Args:
        ctx: the backend's :class:`~atlas_cuda.context.OpContext`.
    """

    def __init__(self, ctx: OpContext) -> None:
        self.ctx = ctx

    def apply_token_bitmask(self, logits: DeviceArray, bitmask: DeviceArray) -> DeviceArray:
        """``-inf`` where bit ``v % 32`` of word ``v // 32`` of a row is clear (see
        :func:`atlas_core.ops.guided.apply_token_bitmask`); float32 ``[num_seqs, vocab]``."""
        logits = self.ctx.f32(logits)
        num_seqs, vocab = logits.shape[0], logits.shape[-1]
        width = bitmask.shape[-1]
        if bitmask.dtype.itemsize != 4 or bitmask.shape[0] != num_seqs or width * 32 < vocab:
            raise ValueError(f"apply_token_bitmask: bitmask {bitmask.shape} {bitmask.dtype} must "
                             f"be int32 [{num_seqs}, {-(-vocab // 32)}] for logits {logits.shape}")
        out = self.ctx.out(logits.shape, np.float32)
        if num_seqs and vocab:
            self.ctx.launch(self.ctx.kernel("guided", None, "apply_token_bitmask_f32"),
                            (-(-vocab // 256), num_seqs), 256, out, logits, bitmask, vocab, width)
        return out
