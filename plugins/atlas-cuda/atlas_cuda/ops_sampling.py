"""Logits-side ops of the cuda backend: argmax, log-softmax, top-k, penalties, sampling."""

from __future__ import annotations

import numpy as np

from atlas_cuda.array import DeviceArray

THREADS = 1024


class SamplingOps:
    """Mixed into :class:`atlas_cuda.ops.CudaOps`; one block per logits row (float32; narrower
    logits are widened first)."""

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
            self._launch(self._k("sampling", None, "argmax_f32"), n, THREADS, out, logits, vocab)
        return out

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
        if n:
            self._launch(self._k("sampling", None, "sample_f32"), n, THREADS, out, probs, logits,
                         vocab, temperature, top_k, top_p, min_p, seeds, steps)
        return out
