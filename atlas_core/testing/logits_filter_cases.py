"""Contract cases of the logits filters (``apply_dry``, ``apply_xtc``, ``apply_top_n_sigma``):
rows that switch each filter on and off in one batch, so a backend must leave the off rows
alone. Their exact sampling distributions are checked in ``tests/test_samplers_filters.py``."""

from __future__ import annotations

import numpy as np

from atlas_core.testing.contracts_cases import OpCase
from atlas_core.testing.contracts_ops import make_rng, randn


def apply_dry_cases() -> list[OpCase]:
    """A repeating context, a breaker inside the repeat, and an off row; then edge rows."""
    rng = make_rng("apply_dry")
    logits = randn(rng, (3, 64), scale=2.0)
    ctx = np.full((3, 12), -1, np.int32)
    ctx[0, :10] = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    ctx[1, :10] = [5, 6, 9, 8, 5, 6, 9, 8, 5, 6]
    ctx[2, :6] = [1, 2, 1, 2, 1, 2]
    breakers = np.array([[-1, -1], [9, -1], [-1, -1]], np.int32)
    return [OpCase("mixed", (logits, ctx, np.array([0.8, 1.0, 0.0], np.float32),
                             np.array([1.75, 2.0, 1.75], np.float32),
                             np.array([2, 1, 2], np.int32), breakers)),
            _dry_edges(rng)]


def _dry_edges(rng) -> OpCase:
    """A breaker as the last token, an all -inf row, an empty context, and a 300-token loop
    whose match stops at a breaker 40 tokens from the end."""
    logits = randn(rng, (4, 64), scale=2.0)
    logits[1] = -np.inf
    ctx = np.full((4, 300), -1, np.int32)
    ctx[0, :9] = [5, 6, 7, 5, 6, 7, 5, 6, 7]
    ctx[1, :6] = [1, 2, 1, 2, 1, 2]
    ctx[3] = np.tile(np.arange(10, 30), 15)
    ctx[3, -40] = 63
    breakers = np.array([[7, -1], [-1, -1], [-1, -1], [-1, 63]], np.int32)
    return OpCase("edges", (logits, ctx, np.ones(4, np.float32), np.full(4, 1.5, np.float32),
                            np.array([1, 1, 1, 3], np.int32), breakers))


def apply_xtc_cases() -> list[OpCase]:
    """Peaked and flat rows, probabilities 1, 0.5 and 0; then ties, -inf and off rows."""
    rng = make_rng("apply_xtc")
    logits = randn(rng, (4, 50), scale=3.0)
    ties = np.log(np.array([0.05, 0.3, 0.2, 0.05, 0.2, 0.1, 0.1], np.float32))
    edges = np.stack([ties, ties, ties])
    edges[1, [0, 3]] = -np.inf
    return [OpCase("mixed", (logits, np.array([0.05, 0.1, 0.1, 0.6], np.float32),
                             np.array([1.0, 0.5, 0.0, 1.0], np.float32),
                             np.arange(4, dtype=np.uint64), np.full(4, 3, np.int64))),
            # ties (the higher index stays), -inf logits, and a threshold above 0.5 (off)
            OpCase("edges", (edges, np.array([0.15, 0.1, 0.6], np.float32), np.ones(3, np.float32),
                             np.zeros(3, np.uint64), np.zeros(3, np.int64)))]


def apply_top_n_sigma_cases() -> list[OpCase]:
    """n of 0.5, 1 and 0 (off); rows partly and wholly -inf, and a constant row."""
    rng = make_rng("apply_top_n_sigma")
    logits = randn(rng, (3, 300), scale=2.0)
    edges = randn(rng, (3, 300), scale=2.0)
    edges[0, ::3] = -np.inf
    edges[1] = -np.inf
    edges[2] = 0.5
    return [OpCase("mixed", (logits, np.array([0.5, 1.0, 0.0], np.float32))),
            OpCase("edges", (edges, np.ones(3, np.float32)))]
