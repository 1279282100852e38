"""Logits -> tokens for the numpy backend: batched softmax, sparse filtering, a numba race.

Semantics are those of :mod:`atlas_core.ops.sampling`; the speed comes from working on whole
batches, sorting only top-p candidates, hashing only unfiltered tokens and skipping neutral
penalty rows.
"""

from __future__ import annotations

import numpy as np

from atlas_core.backends.numpy_kernels import exponential_race
from atlas_core.ops.sampling import GREEDY_TEMPERATURE

# Candidates sorted for top-p before falling back to sorting a whole row.
_TOP_P_CANDIDATES = 512


def argmax(logits):
    return np.argmax(logits, axis=-1).astype(np.int32)


def topk(x, k):
    """Same contract as :func:`atlas_core.ops.reference.topk` (ties: lower index first)."""
    xf = np.asarray(x, dtype=np.float32)
    n, vocab = xf.shape
    if k >= vocab:
        idx = np.argsort(-xf, axis=-1, kind="stable")[:, :k]
        return np.take_along_axis(xf, idx, axis=-1), idx.astype(np.int32)
    kth = -np.partition(-xf, k - 1, axis=-1)[:, k - 1]
    idx = np.empty((n, k), dtype=np.int64)
    for b in range(n):
        cand = np.flatnonzero(xf[b] >= kth[b])
        idx[b] = cand[np.argsort(-xf[b, cand], kind="stable")[:k]]
    return np.take_along_axis(xf, idx, axis=-1), idx.astype(np.int32)


def apply_penalties(logits, prompt_ids, output_ids, repetition_penalty, presence_penalty,
                    frequency_penalty):
    """Same contract as :func:`atlas_core.ops.reference.apply_penalties`."""
    out = np.array(logits, dtype=np.float32)
    vocab = out.shape[1]
    rep = np.asarray(repetition_penalty, dtype=np.float32)
    pres = np.asarray(presence_penalty, dtype=np.float32)
    freq = np.asarray(frequency_penalty, dtype=np.float32)
    for b in np.flatnonzero((rep != 1.0) | (pres != 0.0) | (freq != 0.0)):
        outs = output_ids[b][(output_ids[b] >= 0) & (output_ids[b] < vocab)].astype(np.int64)
        tokens, counts = np.unique(outs, return_counts=True)
        row = out[b]
        r = float(rep[b])
        if r != 1.0:
            prompt = prompt_ids[b][(prompt_ids[b] >= 0) & (prompt_ids[b] < vocab)].astype(np.int64)
            seen = np.union1d(tokens, prompt)
            vals = row[seen]
            row[seen] = np.where(vals > 0, vals / r, vals * r)
        row[tokens] -= float(freq[b]) * counts.astype(np.float32) + float(pres[b])
    return out


def _descending(p: np.ndarray, cand: np.ndarray) -> np.ndarray:
    # cand (ascending indices of positive p) ordered by descending p, ties by index, i.e. the
    # reference's stable argsort; sorting one uint64 key (inverted float bits, index) is ~3x faster.
    keys = (~p[cand].view(np.uint32)).astype(np.uint64) << np.uint64(32) | cand.astype(np.uint64)
    keys.sort()
    return (keys & np.uint64(0xFFFFFFFF)).astype(np.int64)


def _nucleus(p: np.ndarray, cand: np.ndarray, limit) -> tuple[np.ndarray, bool]:
    # Sort candidates like the reference; keep those before the limit.
    cand = _descending(p, cand)
    sorted_p = p[cand]
    drop = np.cumsum(sorted_p) - sorted_p >= limit
    return cand[~drop], bool(drop.any())


def _top_p_keep(p: np.ndarray, top_p: float) -> np.ndarray:
    # Indices of the nucleus of one row. Zeros are never candidates: dropping them is a no-op.
    # Try the largest few first; when they hold too little mass, sort every candidate.
    limit = top_p * p.sum(dtype=np.float32)
    cand = np.flatnonzero(p > 0)
    m = _TOP_P_CANDIDATES
    if len(cand) > m:
        vals = p[cand]
        top = cand[vals >= np.partition(vals, len(cand) - m)[len(cand) - m]]
        if p[top].sum() >= limit * 0.999:
            keep, dropped = _nucleus(p, top, limit)
            if dropped:
                return keep
    return _nucleus(p, cand, limit)[0]


def _filter_rows(p: np.ndarray, top_k: np.ndarray, top_p: np.ndarray, min_p: np.ndarray) -> None:
    # p: [rows, vocab] float32 probabilities, filtered in place like ops.sampling.filter_probs.
    vocab = p.shape[1]
    active = (top_k > 0) & (top_k < vocab)
    for k in np.unique(top_k[active]):
        rows = np.flatnonzero(top_k == k)
        sub = p[rows]
        kth = np.partition(sub, vocab - k, axis=-1)[:, vocab - k]
        sub[sub < kth[:, None]] = 0.0
        p[rows] = sub
    for b in np.flatnonzero(top_p < 1.0):
        keep = _top_p_keep(p[b], float(top_p[b]))
        kept = p[b, keep]
        p[b] = 0.0
        p[b, keep] = kept
    rows = np.flatnonzero(min_p > 0.0)
    if len(rows):
        sub = p[rows]
        sub[sub < min_p[rows, None] * sub.max(axis=-1, keepdims=True)] = 0.0
        p[rows] = sub


def sample(logits, temperature, top_k, top_p, min_p, seeds, steps):
    """Same contract as :func:`atlas_core.ops.reference.sample`."""
    x = np.asarray(logits, dtype=np.float32)
    out = argmax(x)
    temp = np.asarray(temperature, dtype=np.float32)
    rows = np.flatnonzero(temp > GREEDY_TEMPERATURE)
    if not len(rows):
        return out
    z = x[rows] / temp[rows, None]
    z -= z.max(axis=-1, keepdims=True)
    p = np.exp(z, out=z)
    p /= p.sum(axis=-1, keepdims=True)
    _filter_rows(p, np.asarray(top_k)[rows], np.asarray(top_p, dtype=np.float32)[rows],
                 np.asarray(min_p, dtype=np.float32)[rows])
    seeds = np.asarray(seeds).astype(np.uint64)[rows]
    steps = np.asarray(steps).astype(np.uint64)[rows]
    out[rows] = exponential_race(p, seeds, steps)
    return out
