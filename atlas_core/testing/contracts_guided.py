"""Guided-decoding op tests of :class:`~atlas_core.testing.contracts.GpuBackendContract`.

Masking is exact: allowed logits keep their value bit for bit, forbidden ones become ``-inf``.
"""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.ops import reference as ref
from atlas_core.ops.guided import bitmask_width
from atlas_core.testing.contracts_ops import make_rng, randn, run_op


def random_bitmask(rng: np.random.Generator, num_seqs: int, vocab: int) -> np.ndarray:
    """Random allowed sets: row 0 all allowed, row 1 a single token, the rest ~half."""
    bits = rng.random((num_seqs, bitmask_width(vocab) * 32)) < 0.5
    bits[0] = True
    if num_seqs > 1:
        bits[1] = False
        bits[1, vocab - 1] = True
    return np.packbits(bits, axis=1, bitorder="little").view(np.int32)


def assert_masked(out: np.ndarray, logits: np.ndarray, bitmask: np.ndarray) -> None:
    """``out`` equals ``logits`` where the bitmask allows a token and is ``-inf`` elsewhere."""
    out = np.asarray(out)
    assert out.shape == logits.shape and out.dtype == np.float32
    vocab = logits.shape[1]
    allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :vocab] == 1
    np.testing.assert_array_equal(out[allowed], logits[allowed])
    assert np.isneginf(out[~allowed]).all(), "forbidden tokens must be -inf"


class GuidedContract:
    """apply_token_bitmask."""

    @pytest.mark.parametrize("num_seqs,vocab", [(1, 32), (3, 100), (5, 1000), (2, 151936)])
    def test_apply_token_bitmask(self, backend, num_seqs, vocab):
        rng = make_rng("apply_token_bitmask", num_seqs, vocab)
        logits = randn(rng, (num_seqs, vocab), scale=3.0)
        bitmask = random_bitmask(rng, num_seqs, vocab)
        out = run_op(backend, "apply_token_bitmask", logits, bitmask)
        assert_masked(out, logits, bitmask)
        assert_masked(ref.apply_token_bitmask(logits, bitmask), logits, bitmask)

    def test_apply_token_bitmask_all_ones_is_identity(self, backend):
        logits = randn(make_rng("apply_token_bitmask_ones"), (4, 77), scale=2.0)
        out = run_op(backend, "apply_token_bitmask", logits,
                     np.full((4, bitmask_width(77)), -1, np.int32))
        np.testing.assert_array_equal(out, logits)

    def test_apply_token_bitmask_by_hand(self, backend):
        logits = np.arange(40, dtype=np.float32).reshape(1, 40)
        words = np.array([[(1 << 0) | (1 << 5) | (1 << 31), 1 << 7]], np.uint32).view(np.int32)
        out = run_op(backend, "apply_token_bitmask", logits, words)
        assert [v for v in range(40) if np.isfinite(out[0, v])] == [0, 5, 31, 39]
