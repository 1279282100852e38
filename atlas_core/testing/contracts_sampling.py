"""Logits -> tokens tests of :class:`~atlas_core.testing.contracts.GpuBackendContract`.

Sampling is checked four ways: greedy rows equal argmax; a seeded choice is deterministic and
does not depend on the rest of the batch; over many seeds token frequencies match the filtered
distribution; and at float32 the chosen token equals the reference's (same counter-based hash).
"""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.ops import reference as ref
from atlas_core.ops.sampling import filter_probs
from atlas_core.testing.contracts_ops import DTYPES, check_op, make_rng, randn, run_op

#: (temperature, top_k, top_p, min_p) rows exercising each filter alone and together.
SAMPLING_ROWS = [(1.0, 0, 1.0, 0.0), (0.7, 3, 1.0, 0.0), (1.0, 0, 0.8, 0.0), (1.3, 0, 1.0, 0.2),
                 (0.9, 4, 0.9, 0.05), (0.0, 0, 1.0, 0.0)]


def sampling_params(rows, num_seqs: int, seed0: int = 0, step: int = 0):
    """Per-row device-shaped parameter arrays for ``sample`` from ``rows`` cycled over the batch."""
    picked = [rows[i % len(rows)] for i in range(num_seqs)]
    t, k, p, m = (np.array(col) for col in zip(*picked))
    return (t.astype(np.float32), k.astype(np.int32), p.astype(np.float32), m.astype(np.float32),
            np.arange(seed0, seed0 + num_seqs, dtype=np.uint64),
            np.full(num_seqs, step, dtype=np.int64))


class SamplingContract:
    """argmax, log_softmax, topk, apply_penalties, sample."""

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_argmax(self, backend, dtype):
        logits = randn(make_rng("argmax", dtype), (5, 1000), dtype)
        logits[1, [10, 700]] = 50.0  # ties: the first index wins
        check_op(backend, "argmax", logits)

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_log_softmax(self, backend, dtype):
        check_op(backend, "log_softmax", randn(make_rng("log_softmax", dtype), (4, 517), dtype, 4.0))

    @pytest.mark.parametrize("k", [1, 5, 300])
    def test_topk(self, backend, k):
        x = randn(make_rng("topk", k), (6, 300))
        x[2, [4, 9, 200]] = 9.0  # ties: lower index first
        check_op(backend, "topk", x, k)

    def test_apply_penalties(self, backend):
        rng = make_rng("apply_penalties")
        logits = randn(rng, (4, 50), scale=3.0)
        prompt = np.full((4, 7), -1, dtype=np.int32)
        prompt[:, :5] = rng.integers(0, 50, (4, 5))
        output = np.full((4, 9), -1, dtype=np.int32)
        output[:, :6] = rng.integers(0, 50, (4, 6))
        output[1, :6] = [3, 3, 3, 8, 8, 49]
        check_op(backend, "apply_penalties", logits, prompt, output,
                 np.array([1.0, 1.3, 0.8, 1.0], np.float32), np.array([0.0, 0.5, 0.0, 0.0], np.float32),
                 np.array([0.0, 0.25, 0.0, -0.5], np.float32))

    def test_apply_penalties_by_hand(self, backend):
        logits = np.array([[2.0, -2.0, 1.0, 0.5]], np.float32)
        out = run_op(backend, "apply_penalties", logits, np.array([[0, -1]], np.int32),
                     np.array([[1, 2, 2]], np.int32), np.array([2.0], np.float32),
                     np.array([0.5], np.float32), np.array([0.25], np.float32))
        # 0: prompt only -> 2/2; 1: once -> -2*2 - 0.25 - 0.5; 2: twice -> 1/2 - 0.5 - 0.5
        np.testing.assert_allclose(out, [[1.0, -4.75, -0.5, 0.5]], rtol=1e-6)

    def test_sample_greedy_is_argmax(self, backend):
        logits = randn(make_rng("greedy"), (8, 300), scale=3.0)
        params = sampling_params([(0.0, 0, 1.0, 0.0), (1e-6, 5, 0.5, 0.1)], 8)
        out = run_op(backend, "sample", logits, *params)
        np.testing.assert_array_equal(out, np.argmax(logits, axis=-1))

    @pytest.mark.parametrize("vocab", [300, 5000])
    def test_sample_matches_reference(self, backend, vocab):
        logits = randn(make_rng("sample_ref", vocab), (24, vocab), scale=2.0)
        params = sampling_params(SAMPLING_ROWS, 24, seed0=1234, step=7)
        out = run_op(backend, "sample", logits, *params)
        assert out.dtype == np.int32
        np.testing.assert_array_equal(out, ref.sample(logits, *params))

    def test_sample_deterministic_and_batch_independent(self, backend):
        logits = randn(make_rng("sample_batch"), (12, 400), scale=2.0)
        params = sampling_params(SAMPLING_ROWS, 12, seed0=99, step=3)
        first = run_op(backend, "sample", logits, *params)
        np.testing.assert_array_equal(run_op(backend, "sample", logits, *params), first)
        order = np.random.default_rng(5).permutation(12)
        shuffled = run_op(backend, "sample", logits[order], *(p[order] for p in params))
        np.testing.assert_array_equal(shuffled, first[order])
        alone = run_op(backend, "sample", logits[4:5], *(p[4:5] for p in params))
        np.testing.assert_array_equal(alone, first[4:5])

    @pytest.mark.parametrize("row", SAMPLING_ROWS[:5])
    def test_sample_frequencies(self, backend, row):
        """Over 4000 seeds the token counts follow the filtered distribution (chi-square)."""
        num = 4000
        logits = np.array([2.0, 1.5, 1.0, 0.6, 0.3, 0.0, -0.5, -1.0], np.float32)
        params = sampling_params([row], num, seed0=10_000, step=1)
        out = run_op(backend, "sample", np.tile(logits, (num, 1)), *params)
        t, k, p, m = row
        z = logits / t
        probs = filter_probs((np.exp(z - z.max()) / np.exp(z - z.max()).sum()).astype(np.float32),
                             k, p, m)
        probs = probs / probs.sum()
        counts = np.bincount(out, minlength=len(logits))
        assert counts[probs == 0].sum() == 0, f"filtered tokens were sampled: {counts}"
        expected = probs[probs > 0] * num
        chi2 = float(((counts[probs > 0] - expected) ** 2 / expected).sum())
        # 99.99th percentile of chi-square with <= 7 degrees of freedom is about 29.9.
        assert chi2 < 30.0, f"token counts {counts} do not follow {probs} (chi2 {chi2:.1f})"
