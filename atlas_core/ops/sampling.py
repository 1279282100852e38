"""Reference logits -> tokens ops: argmax, log-softmax, top-k, penalties, seeded sampling.

Seeded sampling is counter-based, so a row's choice depends only on its own logits, seed and
step — never on what else is in the batch. The random stream is a splitmix64 hash of
``(seed, step, token_index)``; every backend implements the same hash, and sampling is the
exponential race ``argmax_i p_i / E_i`` with ``E_i = -log(u_i)`` (exactly a draw from ``p``).
"""

from __future__ import annotations

import numpy as np

from atlas_core.ops._dtypes import f32

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)

#: Temperatures at or below this are greedy.
GREEDY_TEMPERATURE = 1e-5


def argmax(logits: np.ndarray) -> np.ndarray:
    """``[num_seqs, vocab]`` -> ``[num_seqs]`` int32 index of the largest logit (first on ties)."""
    return np.argmax(f32(logits), axis=-1).astype(np.int32)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """``[num_seqs, vocab]`` -> float32 log-probabilities."""
    x = f32(logits)
    m = x.max(axis=-1, keepdims=True)
    return (x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))).astype(np.float32)


def topk(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Largest ``k`` values per row, descending: ``(values float32 [n, k], indices int32 [n, k])``."""
    xf = f32(x)
    idx = np.argsort(-xf, axis=-1, kind="stable")[:, :k]
    return np.take_along_axis(xf, idx, axis=-1), idx.astype(np.int32)


def apply_penalties(logits: np.ndarray, prompt_ids: np.ndarray, output_ids: np.ndarray,
                    repetition_penalty: np.ndarray, presence_penalty: np.ndarray,
                    frequency_penalty: np.ndarray) -> np.ndarray:
    """Repetition / presence / frequency penalties (OpenAI + HF semantics).

    Repetition (``r != 1``) divides positive and multiplies negative logits of every token seen
    in the prompt or output; presence subtracts ``p`` once and frequency ``f * count`` for each
    token in the output.

    Args:
        logits: ``[num_seqs, vocab]`` float32.
        prompt_ids, output_ids: ``[num_seqs, max_len]`` int32, padded with ``-1``.
        repetition_penalty, presence_penalty, frequency_penalty: ``[num_seqs]`` float32.

    Returns:
        Penalised float32 logits (a new array).
    """
    out = f32(logits).copy()
    vocab = out.shape[1]
    for b in range(out.shape[0]):
        outs = output_ids[b][output_ids[b] >= 0].astype(np.int64)
        counts = np.bincount(outs, minlength=vocab)[:vocab].astype(np.float32)
        r = float(repetition_penalty[b])
        if r != 1.0:
            seen = counts > 0
            prompt = prompt_ids[b][prompt_ids[b] >= 0].astype(np.int64)
            seen[prompt[prompt < vocab]] = True
            row = out[b]
            out[b] = np.where(seen, np.where(row > 0, row / r, row * r), row)
        out[b] -= float(frequency_penalty[b]) * counts + float(presence_penalty[b]) * (counts > 0)
    return out


def random_uniform(seed: int, step: int, size: int) -> np.ndarray:
    """The sampler's uniforms in (0, 1) for one row: splitmix64 of ``(seed, step, index)``."""
    with np.errstate(over="ignore"):
        z = (np.uint64(seed) * _GOLDEN + np.uint64(step) * _MIX1
             + np.arange(size, dtype=np.uint64) * _MIX2)
        z ^= z >> np.uint64(30)
        z *= _MIX1
        z ^= z >> np.uint64(27)
        z *= _MIX2
        z ^= z >> np.uint64(31)
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def filter_probs(probs: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """Zero the probabilities top-k / top-p / min-p exclude (one row, float32, not renormalised)."""
    p = probs.copy()
    if 0 < top_k < p.shape[0]:
        kth = np.partition(p, -top_k)[-top_k]
        p[p < kth] = 0.0
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        sorted_p = p[order]
        before = np.cumsum(sorted_p) - sorted_p
        drop = before >= top_p * sorted_p.sum()
        p[order[drop]] = 0.0
    if min_p > 0.0:
        p[p < min_p * p.max()] = 0.0
    return p


def sample(logits: np.ndarray, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray,
           min_p: np.ndarray, seeds: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Pick one token per row.

    Rows with ``temperature <= GREEDY_TEMPERATURE`` take the argmax. Others take softmax of
    ``logits / temperature``, keep the top-k (``top_k <= 0`` disables), the top-p nucleus and
    tokens with ``p >= min_p * max(p)``, then draw with the counter-based stream of
    :func:`random_uniform` (``seeds[b]``, ``steps[b]``; the engine passes the output index as step).

    Args:
        logits: ``[num_seqs, vocab]`` float32.
        temperature, top_p, min_p: ``[num_seqs]`` float32.
        top_k: ``[num_seqs]`` int32.
        seeds: ``[num_seqs]`` uint64.
        steps: ``[num_seqs]`` int64.

    Returns:
        ``[num_seqs]`` int32 token ids.
    """
    x = f32(logits)
    out = argmax(x)
    for b in range(x.shape[0]):
        t = float(temperature[b])
        if t <= GREEDY_TEMPERATURE:
            continue
        z = x[b] / t
        p = np.exp(z - z.max())
        p /= p.sum()
        p = filter_probs(p, int(top_k[b]), float(top_p[b]), float(min_p[b]))
        race = p / -np.log(random_uniform(int(seeds[b]), int(steps[b]), p.shape[0]))
        out[b] = int(np.argmax(race))
    return out
