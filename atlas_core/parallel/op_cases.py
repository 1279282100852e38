"""Contract cases of the parallel ops (:mod:`atlas_core.parallel.ops`)."""

from __future__ import annotations

import numpy as np

from atlas_core.testing.contracts_cases import OpCase


def moe_remap_ids_cases() -> list[OpCase]:
    rng = np.random.default_rng(0)
    weights = rng.random((5, 4), np.float32)
    ids = rng.integers(0, 16, (5, 4)).astype(np.int32)
    return [OpCase("middle", (weights, ids, 4, 4)), OpCase("first", (weights, ids, 0, 8)),
            OpCase("none", (weights, ids, 16, 4))]


def embedding_shard_cases() -> list[OpCase]:
    rng = np.random.default_rng(1)
    table = rng.standard_normal((6, 8)).astype(np.float32)
    ids = np.array([0, 5, 6, 11, 12, 2], np.int32)
    return [OpCase("shard1", (ids, table, 6)), OpCase("shard0", (ids, table, 0))]


def gather_vocab_shards_cases() -> list[OpCase]:
    shards = np.random.default_rng(2).standard_normal((3, 2, 5)).astype(np.float32)
    return [OpCase("padded", (shards, 13)), OpCase("even", (shards, 15))]
