"""Logits-side ops of the cuda backend: argmax, log-softmax, top-k, penalties, sampling."""

from __future__ import annotations

import numpy as np

from atlas_cuda import env as cuda_env
from atlas_cuda.array import DeviceArray
from atlas_cuda.ops_attention import COUNTERS

THREADS = 1024
#: Columns per block of the multi-block argmax / draw (151,936-token vocab: 38 blocks a row).
SPLIT_COLUMNS = 4096


class SamplingOps:
    """Mixed into :class:`atlas_cuda.ops.CudaOps`; float32 logits rows (narrower logits are
    widened first). ``argmax`` and ``sample`` split each row over blocks (the last block of a
    row merges, through the completion counters of ``_sync_counters``); the rest run one block
    per row."""

    def _f32(self, x: DeviceArray) -> DeviceArray:
        if x.dtype == np.float32:
            return x
        out = self._out(x.shape, np.float32)
        if x.size:
            self._launch(self._k("elementwise", x.dtype, "to_f32"), min(-(-x.size // 256), 8192),
                         256, out, x, np.int64(x.size))
        return out

    def argmax(self, logits: DeviceArray) -> DeviceArray:
        logits = self._f32(logits)
        n, vocab = logits.shape[0], logits.shape[-1]
        out = self._out((n,), np.int32)
        if n:
            if cuda_env.attn_decode_old():
                self._launch(self._k("sampling", None, "argmax_f32"), n, THREADS, out, logits,
                             vocab)
            else:
                self._argmax_split(out, None, logits)
        return out

    def _argmax_split(self, out: DeviceArray, row_max: DeviceArray | None,
                      logits: DeviceArray) -> tuple[int, int]:
        """Row argmax into ``out`` (and the row maxima into ``row_max``); returns the
        ``(blocks per row, columns per block)`` split."""
        n, vocab = logits.shape[0], logits.shape[-1]
        if n > COUNTERS:
            raise ValueError(f"argmax/sample: {n} rows; the cuda backend takes at most "
                             f"{COUNTERS} per call (split the batch)")
        blocks = max(1, min(64, -(-vocab // SPLIT_COLUMNS)))
        chunk = -(-vocab // blocks)
        part_v, part_i = self._out((n * blocks,), np.float64), self._out((n * blocks,), np.int32)
        self._launch(self._k("sampling", None, "argmax_split_f32"), (blocks, n), THREADS, out,
                     row_max, part_v, part_i, self._sync_counters()[COUNTERS:], logits, vocab,
                     chunk)
        return blocks, chunk

    def log_softmax(self, logits: DeviceArray) -> DeviceArray:
        logits = self._f32(logits)
        n, vocab = logits.shape[0], logits.shape[-1]
        out = self._out(logits.shape, np.float32)
        if n:
            self._launch(self._k("sampling", None, "log_softmax_f32"), n, THREADS, out, logits,
                         vocab)
        return out

    def topk(self, x: DeviceArray, k: int):
        x = self._f32(x)
        n, vocab = x.shape[0], x.shape[-1]
        values, idx = self._out((n, k), np.float32), self._out((n, k), np.int32)
        if n and k:
            self._launch(self._k("sampling", None, "topk_f32"), n, THREADS, values, idx, x,
                         vocab, int(k))
        return values, idx

    def apply_penalties(self, logits: DeviceArray, prompt_ids: DeviceArray,
                        output_ids: DeviceArray, repetition_penalty: DeviceArray,
                        presence_penalty: DeviceArray, frequency_penalty: DeviceArray):
        logits = self._f32(logits)
        n, vocab = logits.shape[0], logits.shape[-1]
        out = self._out(logits.shape, np.float32)
        counts = self._out((n, vocab), np.int32)
        if n:
            self._launch(self._k("sampling", None, "apply_penalties_f32"), n, THREADS, out,
                         counts, logits, prompt_ids, prompt_ids.shape[-1], output_ids,
                         output_ids.shape[-1], repetition_penalty, presence_penalty,
                         frequency_penalty, vocab)
        return out

    def sample(self, logits: DeviceArray, temperature: DeviceArray, top_k: DeviceArray,
               top_p: DeviceArray, min_p: DeviceArray, seeds: DeviceArray,
               steps: DeviceArray) -> DeviceArray:
        logits = self._f32(logits)
        n, vocab = logits.shape[0], logits.shape[-1]
        out = self._out((n,), np.int32)
        probs = self._out((n, vocab), np.float32)
        if not n:
            return out
        sampling = (temperature, top_k, top_p, min_p, seeds, steps)
        if cuda_env.attn_decode_old():
            self._launch(self._k("sampling", None, "sample_f32"), n, THREADS, out, probs, logits,
                         vocab, *sampling)
            return out
        row_max = self._out((n,), np.float32)
        blocks, chunk = self._argmax_split(out, row_max, logits)
        part_v, part_i = self._out((n * blocks,), np.float64), self._out((n * blocks,), np.int32)
        self._launch(self._k("sampling", None, "sample_split_f32"), (blocks, n), THREADS, out,
                     probs, part_v, part_i, self._sync_counters()[COUNTERS:], logits, row_max,
                     vocab, chunk, *sampling)
        return out
