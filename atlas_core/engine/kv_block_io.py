"""KVBlockIO: copies whole KV blocks (or recurrent-state rows) between device pools and host bytes.

A block's host form is one flat ``uint8`` array: for every paged-attention layer in order, the
block's K rows then its V rows (``[block_size, num_kv_heads, head_dim]`` each, in the cache
dtype). Hybrid models' state snapshots move the same way: row ``r`` of every recurrent-state
pool (conv and SSM state of each layer). Only :class:`~atlas_core.interfaces.GpuBackend` methods
are used (first-axis slices, ``to_host``, ``copy_from_host``), so the same code serves the numpy
and cuda backends; runs of consecutive block ids move in one copy per layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def paged_kv_pools(kv_caches: list) -> list:
    """The K and V pools of the paged-attention layers of a model runner's ``kv_caches``."""
    return [pool for layer in kv_caches if isinstance(layer, tuple) for pool in layer]


def block_runs(blocks: list[int]) -> list[tuple[int, int, int]]:
    """``(first_block, count, index_in_blocks)`` for each run of consecutive ids in ``blocks``."""
    runs, i = [], 0
    while i < len(blocks):
        j = i + 1
        while j < len(blocks) and blocks[j] == blocks[j - 1] + 1:
            j += 1
        runs.append((blocks[i], j - i, i))
        i = j
    return runs


class KVBlockIO:
    """Reads and writes first-axis entries (blocks, state rows) of a list of device pools.

    Args:
        backend: the GpuBackend owning the pools.
        pools: device arrays indexed by block (or row) on their first axis, e.g.
            :func:`paged_kv_pools` or a model runner's ``state_pools``.
    """

    def __init__(self, backend: Any, pools: list) -> None:
        self.backend = backend
        self.pools = list(pools)
        self.row_bytes = [int(np.prod(p.shape[1:])) * np.dtype(p.dtype).itemsize
                          for p in self.pools]
        self.block_bytes = sum(self.row_bytes)

    def read(self, blocks: list[int]) -> list[np.ndarray]:
        """Host copies (flat ``uint8``, :attr:`block_bytes` each) of ``blocks``."""
        out = [np.empty(self.block_bytes, np.uint8) for _ in blocks]
        offset = 0
        for pool, size in zip(self.pools, self.row_bytes):
            for first, count, at in block_runs(blocks):
                host = self.backend.to_host(pool[first:first + count])
                flat = np.ascontiguousarray(host).view(np.uint8).reshape(count, size)
                for i in range(count):
                    out[at + i][offset:offset + size] = flat[i]
            offset += size
        return out

    def write(self, blocks: list[int], payloads: list) -> None:
        """Copy host ``payloads`` (as made by :meth:`read`) into ``blocks``."""
        views = [np.frombuffer(p, np.uint8) for p in payloads]
        offset = 0
        for pool, size in zip(self.pools, self.row_bytes):
            for first, count, at in block_runs(blocks):
                rows = np.empty((count, size), np.uint8)
                for i in range(count):
                    rows[i] = views[at + i][offset:offset + size]
                host = rows.view(pool.dtype).reshape((count, *pool.shape[1:]))
                self.backend.copy_from_host(pool[first:first + count], host)
            offset += size
