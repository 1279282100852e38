"""Logits-side ops of the cuda backend: argmax, log-softmax, top-k, penalties, sampling."""

from __future__ import annotations

import numpy as np

from atlas_cuda.array import DeviceArray
from atlas_cuda.context import COUNTERS, OpContext

THREADS = 1024
#: Columns per block of the multi-block argmax / draw (151,936-token vocab: 38 blocks a row).
SPLIT_COLUMNS = 4096


class SamplingOps:
    """Logits-side ops on float32 rows (narrower logits are widened first). ``argmax`` and
    ``sample`` split each row over blocks (the last block of a row merges, through the
    context's completion counters); the rest run one block per row.

    Args:
        ctx: the backend's :class:`~atlas_cuda.context.OpContext`.
    """

    def __init__(self, ctx: OpContext) -> None:
        self.ctx = ctx

    def argmax(self, logits: DeviceArray) -> DeviceArray:
        logits = self.ctx.f32(logits)
        out = self.ctx.out((logits.shape[0],), np.int32)
        if logits.shape[0]:
            self._argmax_split(out, None, logits)
        return out

    def _argmax_split(self, out: DeviceArray, row_max: DeviceArray | None,
                      logits: DeviceArray) -> tuple[int, int]:
        """Row argmax into ``out`` (and the row maxima into ``row_max``); returns the
        ``(blocks per row, columns per block)`` split."""
        ctx = self.ctx
        n, vocab = logits.shape[0], logits.shape[-1]
        if n > COUNTERS:
            raise ValueError(f"argmax/sample: {n} rows; the cuda backend takes at most "
                             f"{COUNTERS} per call (split the batch)")
        blocks = max(1, min(64, -(-vocab // SPLIT_COLUMNS)))
        chunk = -(-vocab // blocks)
        part_v, part_i = ctx.out((n * blocks,), np.float64), ctx.out((n * blocks,), np.int32)
        ctx.launch(ctx.kernel("sampling", None, "argmax_split_f32"), (blocks, n), THREADS, out,
                   row_max, part_v, part_i, ctx.sync_counters()[COUNTERS:], logits, vocab, chunk)
        return blocks, chunk

    def log_softmax(self, logits: DeviceArray) -> DeviceArray:
        ctx = self.ctx
        logits = ctx.f32(logits)
        n, vocab = logits.shape[0], logits.shape[-1]
        out = ctx.out(logits.shape, np.float32)
        if n:
            ctx.launch(ctx.kernel("sampling", None, "log_softmax_f32"), n, THREADS, out, logits,
                       vocab)
        return out

    def topk(self, x: DeviceArray, k: int):
        ctx = self.ctx
        x = ctx.f32(x)
        n, vocab = x.shape[0], x.shape[-1]
        values, idx = ctx.out((n, k), np.float32), ctx.out((n, k), np.int32)
        if n and k:
            ctx.launch(ctx.kernel("sampling", None, "topk_f32"), n, THREADS, values, idx, x, vocab,
                       int(k))
        return values, idx

    def apply_penalties(self, logits: DeviceArray, prompt_ids: DeviceArray,
                        output_ids: DeviceArray, repetition_penalty: DeviceArray,
                        presence_penalty: DeviceArray, frequency_penalty: DeviceArray):
        ctx = self.ctx
        logits = ctx.f32(logits)
        n, vocab = logits.shape[0], logits.shape[-1]
        out = ctx.out(logits.shape, np.float32)
        counts = ctx.out((n, vocab), np.int32)
        if n:
            ctx.launch(ctx.kernel("sampling", None, "apply_penalties_f32"), n, THREADS, out,
                       counts, logits, prompt_ids, prompt_ids.shape[-1], output_ids,
                       output_ids.shape[-1], repetition_penalty, presence_penalty,
                       frequency_penalty, vocab)
        return out

    def sample(self, logits: DeviceArray, temperature: DeviceArray, top_k: DeviceArray,
               top_p: DeviceArray, min_p: DeviceArray, seeds: DeviceArray,
               steps: DeviceArray) -> DeviceArray:
        ctx = self.ctx
        logits = ctx.f32(logits)
        n, vocab = logits.shape[0], logits.shape[-1]
        out = ctx.out((n,), np.int32)
        probs = ctx.out((n, vocab), np.float32)
        if not n:
            return out
        row_max = ctx.out((n,), np.float32)
        blocks, chunk = self._argmax_split(out, row_max, logits)
        part_v, part_i = ctx.out((n * blocks,), np.float64), ctx.out((n * blocks,), np.int32)
        ctx.launch(ctx.kernel("sampling", None, "sample_split_f32"), (blocks, n), THREADS, out,
                   probs, part_v, part_i, ctx.sync_counters()[COUNTERS:], logits, row_max, vocab,
                   chunk, temperature, top_k, top_p, min_p, seeds, steps)
        return out
