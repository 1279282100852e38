"""Logits filters of the cuda backend: DRY, XTC and top-n-sigma (``logits_filters.cu``)."""

from __future__ import annotations

import numpy as np

from atlas_cuda.array import DeviceArray
from atlas_cuda.context import OpContext

THREADS = 1024


def _need(op: str, logits: DeviceArray, **arrays: tuple[DeviceArray, type]) -> None:
    """Refuse a per-row argument of another dtype or row count than the kernel reads."""
    rows = logits.shape[0]
    for name, (a, dtype) in arrays.items():
        if a.dtype != np.dtype(dtype):
            raise TypeError(f"{op}: {name} must be {np.dtype(dtype).name}, got {a.dtype}")
        if a.shape[:1] != (rows,):
            raise ValueError(f"{op}: {name} has shape {a.shape}; expected {rows} rows as logits")


class LogitsFilterOps:
    """DRY, XTC and top-n-sigma with the references' signatures and results
    (:mod:`atlas_core.ops.logits_filters`): one 1,024-thread block per row, float32 rows
    (narrower logits are widened first), a new array out; rows whose parameters switch a filter
    off are copied through. XTC's probabilities come from a device softmax, so a token within
    an ulp or two of the threshold may be classed differently from the reference.

    Args:
        ctx: the backend's :class:`~atlas_cuda.context.OpContext`.
    """

    def __init__(self, ctx: OpContext) -> None:
        self.ctx = ctx

    def _start(self, logits: DeviceArray) -> tuple[DeviceArray, DeviceArray]:
        logits = self.ctx.f32(logits)
        if len(logits.shape) != 2:
            raise ValueError(f"logits filters take [num_seqs, vocab] logits, got {logits.shape}")
        return logits, self.ctx.out(logits.shape, np.float32)

    def apply_dry(self, logits: DeviceArray, token_ids: DeviceArray, multiplier: DeviceArray,
                  base: DeviceArray, allowed_length: DeviceArray,
                  breakers: DeviceArray) -> DeviceArray:
        """Match lengths by warps walking each earlier occurrence of the last token 32 positions
        a round (a walk stops at the last breaker, so it is bounded by the repeat itself), the
        longest per next token kept with ``atomicMax`` in an int32 ``[num_seqs, vocab]``
        scratch, then the penalties (in double, as the reference)."""
        ctx = self.ctx
        logits, out = self._start(logits)
        n, vocab = logits.shape
        _need("apply_dry", logits, token_ids=(token_ids, np.int32),
              multiplier=(multiplier, np.float32), base=(base, np.float32),
              allowed_length=(allowed_length, np.int32), breakers=(breakers, np.int32))
        if len(token_ids.shape) != 2 or len(breakers.shape) != 2:
            raise ValueError(f"apply_dry: token_ids {token_ids.shape} and breakers "
                             f"{breakers.shape} must be [num_seqs, width]")
        if n:
            lengths = ctx.out((n, vocab), np.int32)
            ctx.launch(ctx.kernel("logits_filters", None, "apply_dry_f32"), n, THREADS, out,
                       lengths, logits, token_ids, token_ids.shape[-1], multiplier, base,
                       allowed_length, breakers, breakers.shape[-1], vocab)
        return out

    def apply_xtc(self, logits: DeviceArray, threshold: DeviceArray, probability: DeviceArray,
                  seeds: DeviceArray, steps: DeviceArray) -> DeviceArray:
        """The coin from the sampler's splitmix64 stream (``splitmix.cuh``), exactly the
        reference's; then a softmax and the least likely top choice in one block."""
        ctx = self.ctx
        logits, out = self._start(logits)
        n, vocab = logits.shape
        _need("apply_xtc", logits, threshold=(threshold, np.float32),
              probability=(probability, np.float32), seeds=(seeds, np.uint64),
              steps=(steps, np.int64))
        if n:
            ctx.launch(ctx.kernel("logits_filters", None, "apply_xtc_f32"), n, THREADS, out,
                       logits, threshold, probability, seeds, steps, vocab)
        return out

    def apply_top_n_sigma(self, logits: DeviceArray, n_sigma: DeviceArray) -> DeviceArray:
        """Max, mean and population std (in double) over the finite logits, then the cut."""
        ctx = self.ctx
        logits, out = self._start(logits)
        n, vocab = logits.shape
        _need("apply_top_n_sigma", logits, n_sigma=(n_sigma, np.float32))
        if n:
            ctx.launch(ctx.kernel("logits_filters", None, "apply_top_n_sigma_f32"), n, THREADS,
                       out, logits, n_sigma, vocab)
        return out
