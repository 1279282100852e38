"""Reference block-copy ops: whole KV blocks (or recurrent-state rows) of many pools to and from
rows of one byte array, the staging buffer of the KV tiers' host and disk transfers.

A block's bytes are laid out pool after pool: for pools ``p = 0, 1, …`` with
``row_bytes[p] = pools[p][0].nbytes`` and ``offset[p] = row_bytes[0] + … + row_bytes[p - 1]``,
bytes ``offset[p] : offset[p] + row_bytes[p]`` of a staging row are entry ``b`` of pool ``p``
(its first-axis row, in the pool's dtype and memory layout).
"""

from __future__ import annotations

import numpy as np


def pool_row_bytes(pools: list) -> list[int]:
    """Bytes of one first-axis entry of each pool."""
    return [int(np.prod(p.shape[1:], dtype=np.int64)) * np.dtype(p.dtype).itemsize
            for p in pools]


def _byte_rows(pool: np.ndarray) -> np.ndarray:
    # pool: [num_rows, ...] -> [num_rows, row_bytes] uint8 view
    return pool.reshape(pool.shape[0], -1).view(np.uint8)


def _check(pools: list, block_ids: np.ndarray, staging: np.ndarray, what: str) -> list[int]:
    sizes = pool_row_bytes(pools)
    want = (len(block_ids), sum(sizes))
    if staging.dtype != np.uint8 or tuple(staging.shape) != want:
        raise ValueError(f"{what}: staging rows must be uint8 {list(want)}, got "
                         f"{staging.dtype} {list(staging.shape)}")
    return sizes


def gather_blocks(pools: list, block_ids: np.ndarray, out: np.ndarray) -> None:
    """Copy entries ``block_ids`` of every pool into the rows of ``out`` (in place)::

        out[i, offset[p] : offset[p] + row_bytes[p]] = bytes of pools[p][block_ids[i]]

    Args:
        pools: arrays of any dtype and shape, contiguous, indexed by block (or state row) on
            their first axis: the K and V pools of every paged-attention layer, or the
            recurrent-state pools of a hybrid model.
        block_ids: ``[n]`` int32, each a valid first-axis index of every pool.
        out: ``[n, sum(row_bytes)]`` uint8, written.
    """
    ids = np.asarray(block_ids, dtype=np.int64)
    offset = 0
    for pool, size in zip(pools, _check(pools, ids, out, "gather_blocks")):
        out[:, offset:offset + size] = _byte_rows(pool)[ids]
        offset += size


def scatter_blocks(rows: np.ndarray, block_ids: np.ndarray, pools: list) -> None:
    """The inverse of :func:`gather_blocks`: write row ``i`` of ``rows`` into entry
    ``block_ids[i]`` of every pool (in place)::

        bytes of pools[p][block_ids[i]] = rows[i, offset[p] : offset[p] + row_bytes[p]]

    Args:
        rows: ``[n, sum(row_bytes)]`` uint8.
        block_ids: ``[n]`` int32, distinct, each a valid first-axis index of every pool.
        pools: as for :func:`gather_blocks`; entries not named by ``block_ids`` are untouched.
    """
    ids = np.asarray(block_ids, dtype=np.int64)
    offset = 0
    for pool, size in zip(pools, _check(pools, ids, rows, "scatter_blocks")):
        _byte_rows(pool)[ids] = rows[:, offset:offset + size]
        offset += size
