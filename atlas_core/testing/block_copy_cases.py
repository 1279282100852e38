"""Contract cases of the block-copy ops (:mod:`atlas_core.ops.block_copy`): KV pools of one
shape, and pools of mixed dtypes and row sizes like a hybrid model's recurrent state (rows of
6 and 60 bytes: unaligned offsets; 256 KiB rows: one block's copy split across thread blocks),
with block ids out of order."""

from __future__ import annotations

import numpy as np

from atlas_core.ops.block_copy import gather_blocks, pool_row_bytes
from atlas_core.testing.contracts_cases import OpCase
from atlas_core.testing.contracts_ops import make_rng, randn

#: (name, [(first-axis length, row shape, dtype)] per pool, block ids)
LAYOUTS = (
    ("kv", [(12, (16, 2, 8), "bfloat16")] * 4, [7, 2, 3, 11, 0]),
    ("hybrid", [(6, (3, 5), "float32"), (6, (3,), "float16"), (6, (4, 8), "bfloat16"),
                (6, (2, 16, 4), "float32")], [5, 1, 2]),
    ("wide", [(3, (65536,), "float32"), (3, (8, 8), "bfloat16")], [2, 0]),
)


def _pools(rng: np.random.Generator, spec: list) -> list[np.ndarray]:
    return [randn(rng, (n, *shape), dtype) for n, shape, dtype in spec]


def gather_blocks_cases() -> list[OpCase]:
    """Every layout; the output rows start as a byte pattern that must be overwritten."""
    cases = []
    for name, spec, ids in LAYOUTS:
        pools = _pools(make_rng("gather_blocks", name), spec)
        out = np.full((len(ids), sum(pool_row_bytes(pools))), 0xAB, np.uint8)
        cases.append(OpCase(name, (pools, np.asarray(ids, np.int32), out)))
    return cases


def scatter_blocks_cases() -> list[OpCase]:
    """Every layout; the rows hold blocks of other pools of the same shapes, so entries not
    named keep their values and named ones take the others' exactly."""
    cases = []
    for name, spec, ids in LAYOUTS:
        rng = make_rng("scatter_blocks", name)
        pools, sources = _pools(rng, spec), _pools(rng, spec)
        rows = np.empty((len(ids), sum(pool_row_bytes(pools))), np.uint8)
        gather_blocks(sources, np.arange(len(ids), dtype=np.int32), rows)
        cases.append(OpCase(name, (rows, np.asarray(ids, np.int32), pools)))
    return cases
