"""Verification of one-hot drafts keeps the target distribution exactly (statistical test).

The engine samples each verified row with the usual seeded sampler and keeps a draft while it
equals the sample before it (:func:`atlas_core.engine.spec.num_accepted`). For a draft ``d``
and target ``p`` (after temperature, top-k / top-p / min-p), rejection sampling asks for: accept
with probability ``p(d)``; on rejection, a token from ``p`` restricted to ``!= d``; overall,
exactly ``p``.
"""

import numpy as np

from atlas_core.engine.spec import num_accepted
from atlas_core.ops.reference import sample
from atlas_core.ops.sampling import filter_probs

N = 4000


def target_probs(logits, temperature, top_k, top_p, min_p):
    z = logits / temperature
    p = np.exp(z - z.max())
    p = filter_probs((p / p.sum()).astype(np.float32), top_k, top_p, min_p).astype(np.float64)
    return p / p.sum()


def draw(logits, temperature=0.8, top_k=0, top_p=0.95, min_p=0.0, step=3):
    rows = np.repeat(logits[None].astype(np.float32), N, axis=0)
    vec = lambda v, t: np.full(N, v, t)  # noqa: E731
    return sample(rows, vec(temperature, np.float32), vec(top_k, np.int32),
                  vec(top_p, np.float32), vec(min_p, np.float32),
                  np.arange(N, dtype=np.uint64) * 7919 + 11, vec(step, np.int64))


def chi_square_ok(counts, probs):
    keep = probs * counts.sum() >= 5
    expected = probs[keep] * counts.sum()
    stat = ((counts[keep] - expected) ** 2 / expected).sum()
    dof = max(1, keep.sum() - 1)
    return stat < dof + 6 * np.sqrt(2 * dof)


def test_acceptance_is_p_of_the_draft_and_rejections_follow_the_residual():
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 1.5, 16)
    p = target_probs(logits, 0.8, 0, 0.95, 0.0)
    for draft in (int(np.argmax(p)), int(np.argsort(p)[-3]), int(np.argmin(p))):
        tokens = draw(logits)
        accepted = np.array([num_accepted([int(t), 0], [draft]) for t in tokens])
        rate = accepted.mean()
        assert abs(rate - p[draft]) < 4 * np.sqrt(p[draft] * (1 - p[draft]) / N) + 1e-9
        rejected = tokens[accepted == 0]
        residual = p.copy()
        residual[draft] = 0
        if residual.sum() > 0 and len(rejected) > 100:
            residual /= residual.sum()
            assert chi_square_ok(np.bincount(rejected, minlength=16), residual)
        assert chi_square_ok(np.bincount(tokens, minlength=16), p)


def test_a_chain_of_drafts_stops_at_the_first_rejection():
    rng = np.random.default_rng(6)
    logits = [rng.normal(0, 2.0, 8) for _ in range(3)]
    probs = [target_probs(x, 1.0, 4, 1.0, 0.0) for x in logits]
    drafts = [int(np.argmax(q)) for q in probs]
    rows = [draw(x, 1.0, 4, 1.0, 0.0, step=10 + j) for j, x in enumerate(logits)]
    counts = np.array([num_accepted([int(r[i]) for r in rows], drafts[:2]) for i in range(N)])
    a, b = probs[0][drafts[0]], probs[1][drafts[1]]
    want = np.array([1 - a, a * (1 - b), a * b])
    assert chi_square_ok(np.bincount(counts, minlength=3), want)
