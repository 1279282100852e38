"""Reference logits filters run before ``sample``: DRY, XTC and top-n-sigma.

Each takes ``[num_seqs, vocab]`` float32 logits and per-row parameter vectors, returns new
logits, and leaves rows whose parameters switch it off unchanged. Names and semantics follow
the samplers text-generation-webui and llama.cpp users know:

* DRY ("don't repeat yourself"): a token that would extend a repeat of an earlier stretch of
  the context is penalised by ``multiplier * base ** (match_length - allowed_length)``.
* XTC ("exclude top choices"): with probability ``probability`` per step, every token whose
  probability is at least ``threshold`` is removed except the least likely of them.
* top-n-sigma: keep tokens whose logit is within ``n`` standard deviations of the largest.
"""

from __future__ import annotations

import numpy as np

from atlas_core.ops._dtypes import f32
from atlas_core.ops.sampling import random_uniform

#: Mixed into a row's seed so XTC's coin is independent of the sampler's race.
XTC_SEED_SALT = 0x5854435F434F494E
#: Largest DRY penalty (keeps very long repeats finite: a penalised row never becomes all -inf).
MAX_DRY_PENALTY = 1e9


def _dry_match_lengths(ctx: np.ndarray, breakers: np.ndarray, vocab: int) -> np.ndarray:
    # For each next token t: the longest suffix of ctx that occurred earlier followed by t.
    lengths = np.zeros(vocab, np.int64)
    n = len(ctx)
    if n < 2 or ctx[-1] in breakers:
        return lengths
    ends = np.flatnonzero(ctx[:-1] == ctx[-1])
    nxt = ctx[ends + 1]
    ok = (nxt >= 0) & (nxt < vocab) & ~np.isin(nxt, breakers)
    ends, nxt = ends[ok], nxt[ok]
    match = np.ones(len(ends), np.int64)
    active = np.ones(len(ends), bool)
    while active.any():
        j = ends - match
        tail = n - 1 - match
        can = active & (j >= 0)
        jj = np.where(can, j, 0)
        same = can & (ctx[jj] == ctx[np.maximum(tail, 0)]) & ~np.isin(ctx[jj], breakers)
        match = np.where(same, match + 1, match)
        active = same
    np.maximum.at(lengths, nxt, match)
    return lengths


def apply_dry(logits: np.ndarray, token_ids: np.ndarray, multiplier: np.ndarray,
              base: np.ndarray, allowed_length: np.ndarray, breakers: np.ndarray) -> np.ndarray:
    """DRY repetition penalty (text-generation-webui / llama.cpp ``dry_*``).

    For a row's context ``c`` (prompt then output), every earlier position ``i`` with
    ``c[i] == c[-1]`` whose next token ``t = c[i + 1]`` is not a breaker gives a match: the
    number of tokens of ``c[..i]`` that equal the end of ``c``, counted backwards and stopped
    by a breaker token. With ``L`` the longest match for ``t``, ``t``'s logit drops by
    ``min(multiplier * base ** (L - allowed_length), MAX_DRY_PENALTY)`` when
    ``L >= allowed_length``. No penalty when the last token is a breaker.

    Args:
        logits: ``[num_seqs, vocab]`` float32.
        token_ids: ``[num_seqs, max_len]`` int32 context, padded with ``-1`` at the end.
        multiplier: ``[num_seqs]`` float32; ``0`` switches DRY off for the row.
        base: ``[num_seqs]`` float32, ``> 1``.
        allowed_length: ``[num_seqs]`` int32, ``>= 1``.
        breakers: ``[num_seqs, max_breakers]`` int32 token ids, padded with ``-1``.

    Returns:
        Penalised float32 logits (a new array).
    """
    out = f32(logits).copy()
    vocab = out.shape[1]
    for b in np.flatnonzero(np.asarray(multiplier) > 0):
        row = np.asarray(token_ids[b])
        ctx = row[:np.flatnonzero(row >= 0).max() + 1] if (row >= 0).any() else row[:0]
        stops = np.asarray(breakers[b])
        lengths = _dry_match_lengths(ctx.astype(np.int64), stops[stops >= 0], vocab)
        hit = lengths >= int(allowed_length[b])
        if hit.any():
            excess = (lengths[hit] - int(allowed_length[b])).astype(np.float64)
            power = np.power(float(base[b]), excess)
            penalty = np.minimum(float(multiplier[b]) * power, MAX_DRY_PENALTY)
            out[b, hit] -= penalty.astype(np.float32)
    return out


def xtc_coin(seed: int, step: int) -> float:
    """The uniform in (0, 1) deciding whether XTC acts on a row at ``step``."""
    return float(random_uniform(seed ^ XTC_SEED_SALT, step, 1)[0])


def apply_xtc(logits: np.ndarray, threshold: np.ndarray, probability: np.ndarray,
              seeds: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """XTC, exclude top choices (text-generation-webui / llama.cpp ``xtc_*``).

    A row acts when ``probability > 0``, ``threshold <= 0.5`` and
    :func:`xtc_coin` ``(seeds[b], steps[b]) < probability``. Then, with ``p = softmax(logits)``,
    if two or more tokens have ``p >= threshold`` all of them are set to ``-inf`` except the
    least likely one (on ties the highest index stays).

    Args:
        logits: ``[num_seqs, vocab]`` float32.
        threshold, probability: ``[num_seqs]`` float32.
        seeds: ``[num_seqs]`` uint64; steps: ``[num_seqs]`` int64 (the output index, as ``sample``).

    Returns:
        Filtered float32 logits (a new array).
    """
    out = f32(logits).copy()
    prob, thr = np.asarray(probability, np.float32), np.asarray(threshold, np.float32)
    for b in np.flatnonzero((prob > 0) & (thr <= 0.5)):
        if xtc_coin(int(seeds[b]), int(steps[b])) >= float(prob[b]):
            continue
        z = out[b] - out[b].max()
        p = np.exp(z) / np.exp(z).sum()
        top = np.flatnonzero(p >= thr[b])
        if len(top) < 2:
            continue
        keep = top[np.flatnonzero(p[top] == p[top].min())[-1]]
        out[b, top[top != keep]] = -np.inf
    return out


def apply_top_n_sigma(logits: np.ndarray, n_sigma: np.ndarray) -> np.ndarray:
    """top-n-sigma (Tang et al. 2024; llama.cpp ``top_n_sigma``).

    Keeps tokens with ``logit >= max - n * std`` where the mean and (population) standard
    deviation are over the row's finite logits; the rest become ``-inf``. The rule is the same
    before or after temperature scaling. Rows with ``n_sigma <= 0`` are unchanged.

    Args:
        logits: ``[num_seqs, vocab]`` float32.
        n_sigma: ``[num_seqs]`` float32.

    Returns:
        Filtered float32 logits (a new array).
    """
    out = f32(logits).copy()
    for b in np.flatnonzero(np.asarray(n_sigma) > 0):
        row = out[b]
        finite = row[np.isfinite(row)]
        if not len(finite):
            continue
        limit = finite.max() - float(n_sigma[b]) * float(finite.astype(np.float64).std())
        row[row < np.float32(limit)] = -np.inf
    return out
