"""DRY, XTC and top-n-sigma on the cuda backend equal the NumPy references bit for bit: mixed
batches of 151,936-token rows, 40k-token DRY contexts and the edge rows (off, all -inf, a
breaker last, padding inside the context). The generated contract cases cover the small ones;
tests/test_samplers_filters.py samples the filtered distributions on cuda too."""

import numpy as np
import pytest

from atlas_core.api import bfloat16
from atlas_core.api import reference as ref

from cuda_probe import HAS_GPU

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")]

VOCAB = 151_936


def _check(be, name, logits, *args):
    """Run op ``name`` on the device; assert it equals the reference exactly and left its
    input alone; return the result."""
    dev = be.from_host(logits)
    got = be.to_host(getattr(be.ops, name)(dev, *(be.from_host(a) for a in args)))
    with np.errstate(invalid="ignore", over="ignore"):
        want = getattr(ref, name)(logits, *args)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(be.to_host(dev), logits)
    return got


def _pad(rows, width):
    out = np.full((len(rows), width), -1, np.int32)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


# ---- top-n-sigma -----------------------------------------------------------------------------

def test_top_n_sigma_mixed_rows(cuda_backend):
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal((8, VOCAB)) * 2).astype(np.float32)
    logits[1, rng.choice(VOCAB, 5000, replace=False)] = -np.inf
    logits[2] = -np.inf
    logits[3, :3] = [np.inf, np.nan, -np.inf]
    logits[4] = 1.5
    n_sigma = np.array([1.0, 0.5, 1.0, 2.0, 1.0, 0.0, -1.0, 3.0], np.float32)
    out = _check(cuda_backend, "apply_top_n_sigma", logits, n_sigma)
    assert 0 < np.isfinite(out[0]).sum() < VOCAB // 4
    np.testing.assert_array_equal(out[[2, 4, 5, 6]], logits[[2, 4, 5, 6]])


def test_top_n_sigma_widens_bf16_logits(cuda_backend):
    logits = (np.random.default_rng(2).standard_normal((3, 1000)) * 3).astype(bfloat16)
    _check(cuda_backend, "apply_top_n_sigma", logits, np.array([0.5, 1.0, 2.0], np.float32))


# ---- XTC -------------------------------------------------------------------------------------

def _xtc_row(rng, probs, num_neg_inf=0):
    """A row whose softmax gives (to float32 rounding) ``probs`` at random positions (returned),
    the rest of the mass spread over standard-normal logits."""
    row = rng.standard_normal(VOCAB)
    at = rng.choice(VOCAB, len(probs) + num_neg_inf, replace=False)
    row[at[len(probs):]] = -np.inf
    at = at[:len(probs)]
    others = np.ones(VOCAB, bool)
    others[at] = False
    rest = np.log(np.exp(row[others]).sum())
    row[at] = rest + np.log(np.asarray(probs) / (1.0 - sum(probs)))
    return row.astype(np.float32), at


def _assert_clear_of_threshold(logits, threshold, margin=1e-4):
    """No token's probability is within ``margin`` (relative) of its row's threshold: the
    device softmax may differ from NumPy's by an ulp or two, so such tokens are excluded."""
    for row, thr in zip(logits.astype(np.float64), threshold):
        if np.isfinite(row).any():
            p = np.exp(row - row.max())
            p /= p.sum()
            assert np.abs(p - thr).min() > margin * thr


def test_xtc_mixed_rows(cuda_backend):
    rng = np.random.default_rng(3)
    shapes = [(0.3, 0.2, 0.15), (0.5,), (0.3, 0.2), (0.25, 0.25, 0.2), (0.3, 0.2, 0.15),
              (0.3, 0.2, 0.2), (), (0.4, 0.3)]
    rows = [_xtc_row(rng, p, 10_000 if i == 7 else 0) for i, p in enumerate(shapes)]
    logits = np.stack([r for r, _ in rows])
    logits[6] = -np.inf
    threshold = np.array([0.1, 0.1, 0.1, 0.1, 0.6, 0.1, 0.1, 0.05], np.float32)
    probability = np.array([1.0, 1.0, 0.0, 0.5, 1.0, 1.0, 1.0, 1.0], np.float32)
    _assert_clear_of_threshold(np.delete(logits, 6, 0), np.delete(threshold, 6))
    out = _check(cuda_backend, "apply_xtc", logits, threshold, probability,
                 np.arange(100, 108, dtype=np.uint64), np.arange(8, dtype=np.int64) * 5)
    removed = [set(np.flatnonzero(np.isneginf(out[b]) & np.isfinite(logits[b])))
               for b in range(8)]
    assert removed[0] == set(rows[0][1][:2])
    assert removed[1] == removed[2] == removed[4] == removed[6] == set()
    tie = rows[5][1]
    assert removed[5] == {tie[0], min(tie[1:])}, "on ties the highest index stays"
    assert removed[7] == {rows[7][1][0]}


def test_xtc_coin_is_the_reference_stream(cuda_backend):
    num = 512
    logits = np.tile(np.log(np.array([0.4, 0.3, 0.2, 0.1], np.float32)), (num, 1))
    out = _check(cuda_backend, "apply_xtc", logits, np.full(num, 0.15, np.float32),
                 np.full(num, 0.5, np.float32), np.arange(num, dtype=np.uint64) * 7919,
                 np.arange(num, dtype=np.int64))
    assert 0.4 < np.isneginf(out[:, 0]).mean() < 0.6


# ---- DRY -------------------------------------------------------------------------------------

def test_dry_by_hand(cuda_backend):
    ctx = np.array([[1, 2, 3, 1, 2, -1], [4, 1, 2, 3, 4, 1]], np.int32)
    logits = np.zeros((2, 8), np.float32)
    out = _check(cuda_backend, "apply_dry", logits, ctx, np.ones(2, np.float32),
                 np.full(2, 1.75, np.float32), np.array([2, 1], np.int32),
                 np.full((2, 1), -1, np.int32))
    assert out[0, 3] == -1.0 and out[1, 2] == np.float32(-1.75)
    assert np.count_nonzero(out) == 2


def _long_dry_case():
    """Eight rows of a 40k-token batch; the expectations of each are checked by hand too."""
    rng = np.random.default_rng(4)
    text = rng.integers(0, VOCAB - 10, 40_000).astype(np.int32)
    text[-20:] = text[5_000:5_020]
    cycle = rng.choice(VOCAB - 10, 97, replace=False)
    loop = np.tile(cycle, 40_000 // 97 + 1)[:40_000]
    ctx = _pad([text, loop, loop, [5, 6, 7, 5, 6, 7, 5, 6, 7], [9, 1, 2, 3, 4, 9, 1, 2, 3],
                [VOCAB + 7, 42, VOCAB + 7, 42], [], [1, -1, 2, 3, 5, 1, -1, 2, 3, 4, 1, -1, 2, 3]],
               40_000)
    stops = [list(range(VOCAB - 10, VOCAB)), [], [], [7], [2], [], [], list(range(1000, 1100))]
    stops[7][90] = 4
    params = (np.array([0.8, 1.0, 0.0, 1.0, 0.5, 1.0, 0.25, 1.5], np.float32),
              np.array([1.75, 1.75, 1.75, 2.0, 3.0, 1.75, 2.0, 1.5], np.float32),
              np.array([2, 2, 2, 1, 1, 1, 0, 3], np.int32), _pad(stops, 100))
    logits = (rng.standard_normal((8, VOCAB)) * 2).astype(np.float32)
    logits[5] = -np.inf
    return logits, ctx, params, text[5_020], cycle[(40_000 % 97)]


def test_dry_long_contexts_and_edge_rows(cuda_backend):
    logits, ctx, params, after_repeat, after_loop = _long_dry_case()
    out = _check(cuda_backend, "apply_dry", logits, ctx, *params)
    changed = [set(np.flatnonzero(out[b] != logits[b])) for b in range(8)]
    assert changed[0] == {after_repeat}
    assert out[0, after_repeat] == logits[0, after_repeat] - np.float32(
        float(np.float32(0.8)) * 1.75 ** 18)
    assert changed[1] == {after_loop} and out[1, after_loop] == logits[1, after_loop] - 1e9
    assert changed[2] == changed[3] == changed[5] == set()
    assert changed[4] == {4} and out[4, 4] == logits[4, 4] - np.float32(0.5)
    assert len(changed[6]) == VOCAB
    assert changed[7] == {5} and out[7, 5] == logits[7, 5] - np.float32(1.5 * 1.5)
