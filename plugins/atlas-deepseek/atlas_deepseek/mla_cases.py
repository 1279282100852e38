"""Contract cases of the MLA ops (``OpSpec(cases=...)``); imported only by tests.

Shapes: a tiny one (4 heads, latent 32 + rope 8) and the real widths (DeepSeek-V3: 16 of its
128 heads, latent 512 + rope 64, nope 128, v 128; Mistral-Small-4: latent 256 + rope 64, nope 64).
Batches mix a decode row, a whole prefill and a prefix-cached chunk over shuffled blocks.
"""

from __future__ import annotations

import numpy as np

from atlas_core.api import rope_cos_sin_cache
from atlas_core.testing.contracts_cases import OpCase
from atlas_core.testing.contracts_ops import (BLOCK_SIZE, DTYPES, make_block_tables, make_rng,
                                              poisoned, randn)

#: (heads, kv_lora_rank, rope_dim, nope_dim, v_head_dim)
SHAPES = ((4, 32, 8, 16, 16), (16, 512, 64, 128, 128), (8, 256, 64, 64, 128))
#: (query rows, context length) per sequence: decode, prefill, prefix-cached chunk.
BATCH = ((1, 20), (5, 5), (3, 37))
MAX_POS = 64
NUM_BLOCKS = 10
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}


def _rope_table(rope_dim: int) -> np.ndarray:
    return rope_cos_sin_cache(rope_dim, MAX_POS, ROPE)


def _batch(rng):
    seq_lens = np.array([n for _, n in BATCH], np.int32)
    cu = np.concatenate([[0], np.cumsum([q for q, _ in BATCH])]).astype(np.int32)
    tables = make_block_tables(rng, seq_lens, NUM_BLOCKS)
    return seq_lens, cu, tables


def _cache(rng, dtype, rank, rope):
    return randn(rng, (NUM_BLOCKS, BLOCK_SIZE, 1, rank + rope), dtype)


def _id(dtype, shape) -> str:
    return f"{dtype}-h{shape[0]}-c{shape[1]}-r{shape[2]}"


def _cases(op: str, build, shapes=SHAPES) -> list[OpCase]:
    """The cases of ``op`` for every dtype and shape: ``build(rng, dtype, *shape)`` (``rng``
    seeded from ``op``, dtype and shape) yields ``(id suffix, args, kwargs)`` per case."""
    cases = []
    for dtype in DTYPES:
        for shape in shapes:
            rng = make_rng(op, dtype, shape)
            cases += [OpCase(_id(dtype, shape) + suffix, args, kwargs)
                      for suffix, args, kwargs in build(rng, dtype, *shape)]
    return cases


def _latent_cache(rng, dtype, heads, rank, rope, nope, v):
    kv_a = randn(rng, (5, rank + rope), dtype)
    weight = (1.0 + 0.1 * rng.standard_normal(rank)).astype(np.float32).astype(kv_a.dtype)
    positions = rng.integers(0, MAX_POS, 5).astype(np.int32)
    slots = rng.permutation(NUM_BLOCKS * BLOCK_SIZE)[:5].astype(np.int32)
    slots[2] = -1
    for neox in (False, True):
        cache = poisoned((NUM_BLOCKS, BLOCK_SIZE, 1, rank + rope), dtype)
        yield (f"-{'neox' if neox else 'pairs'}",
               (kv_a, weight, 1e-6, positions, _rope_table(rope), cache, slots),
               {"kv_lora_rank": rank, "is_neox": neox})


def _rope_query(rng, dtype, heads, rank, rope, nope, v):
    q = randn(rng, (7, heads, nope + rope), dtype)
    positions = rng.integers(0, MAX_POS, 7).astype(np.int32)
    for neox, beta in ((False, 0.0), (True, 0.1)):
        yield (f"-neox{int(neox)}-beta{beta:g}", (q, positions, _rope_table(rope)),
               {"nope_dim": nope, "is_neox": neox, "attn_scale_beta": beta,
                "attn_scale_original": 8})


def _absorb_query(rng, dtype, heads, rank, rope, nope, v):
    q_nope = randn(rng, (6, heads, nope), dtype)
    kv_b = randn(rng, (heads * (nope + v), rank), dtype, rank ** -0.5)
    yield "", (q_nope, kv_b), {}


def _absorb_output(rng, dtype, heads, rank, rope, nope, v):
    o_lat = randn(rng, (6, heads, rank), dtype)
    kv_b = randn(rng, (heads * (nope + v), rank), dtype, rank ** -0.5)
    yield "", (o_lat, kv_b, v), {}


def _absorbed_attention(rng, dtype, heads, rank, rope, nope, v):
    seq_lens, cu, tables = _batch(rng)
    cache = _cache(rng, dtype, rank, rope)
    scale = (rank + rope) ** -0.5
    for name, rows in (("mixed", cu), ("decode", np.arange(4, dtype=np.int32))):
        n = int(rows[-1])
        q_lat = randn(rng, (n, heads, rank), dtype)
        q_pe = randn(rng, (n, heads, rope), dtype)
        yield f"-{name}", (q_lat, q_pe, cache, tables, seq_lens, rows, scale), {}


def _gather_latent(rng, dtype, heads, rank, rope, nope, v):
    seq_lens, _, tables = _batch(rng)
    yield "", (_cache(rng, dtype, rank, rope), tables, seq_lens, int(seq_lens.sum()), rank), {}


def _expanded_attention(rng, dtype, heads, rank, rope, nope, v):
    seq_lens, cu, _ = _batch(rng)
    n, ctx = int(cu[-1]), int(seq_lens.sum())
    yield "", (randn(rng, (n, heads, nope), dtype), randn(rng, (n, heads, rope), dtype),
               randn(rng, (ctx, heads, nope + v), dtype), randn(rng, (ctx, rope), dtype),
               seq_lens, cu, (nope + rope) ** -0.5), {}


def mla_latent_cache_cases() -> list[OpCase]:
    """Five tokens into a NaN-poisoned cache (one skipped with slot -1), both rope layouts."""
    return _cases("mla_latent_cache", _latent_cache)


def mla_rope_query_cases() -> list[OpCase]:
    """Seven tokens, both rope layouts, with and without Llama-4 scaling."""
    return _cases("mla_rope_query", _rope_query)


def mla_absorb_query_cases() -> list[OpCase]:
    return _cases("mla_absorb_query", _absorb_query)


def mla_absorb_output_cases() -> list[OpCase]:
    return _cases("mla_absorb_output", _absorb_output)


def mla_absorbed_attention_cases() -> list[OpCase]:
    """The mixed batch of :data:`BATCH`, and a decode-only batch of the same sequences."""
    return _cases("mla_absorbed_attention", _absorbed_attention)


def mla_gather_latent_cases() -> list[OpCase]:
    return _cases("mla_gather_latent", _gather_latent, SHAPES[:2])


def mla_expanded_attention_cases() -> list[OpCase]:
    return _cases("mla_expanded_attention", _expanded_attention, SHAPES[:2])
