"""Block-copy ops of the cuda backend (``kernels/cuda/common/copy.cu``): the KV tiers' gather
of whole blocks from every pool into a staging buffer, and the scatter back."""

from __future__ import annotations

import math

import numpy as np

from atlas_cuda.array import DeviceArray
from atlas_cuda.context import OpContext
from atlas_cuda.memory import require_eager

#: Bytes one thread block moves of a wide pool entry (recurrent state rows of many MB).
PART_BYTES = 64 << 10
#: Pool tables kept on the device (one per pool list: the KV tiers use two, graph-captured
#: speculative verify steps one per Gated DeltaNet layer, whose tables must be built before
#: capture and never rebuilt under it).
MAX_TABLES = 256


class BlockCopyOps:
    """``gather_blocks`` and ``scatter_blocks``: one launch moves a chunk of blocks of every
    pool, a thread block per (block, pool, part of the entry), 16-byte vectors.

    Args:
        ctx: the backend's :class:`~atlas_cuda.context.OpContext`.
    """

    def __init__(self, ctx: OpContext) -> None:
        self.ctx = ctx
        self._tables: dict[tuple, tuple[DeviceArray, int, int]] = {}

    def _table(self, pools: list) -> tuple[DeviceArray, int, int]:
        # (device table of PoolRows, bytes of a staging row, widest entry), cached per list.
        key = tuple((p.ptr, p.shape, p.dtype.str) for p in pools)
        hit = self._tables.get(key)
        if hit is None:
            require_eager(self.ctx.backend, "gather_blocks / scatter_blocks")
            sizes = [math.prod(p.shape[1:]) * p.dtype.itemsize for p in pools]
            table = np.zeros((len(pools), 4), np.uint64)
            table[:, 0] = [p.ptr for p in pools]
            table[:, 1] = sizes
            table[:, 2] = np.cumsum([0, *sizes[:-1]])
            table[:, 3] = [p.shape[0] for p in pools]
            if len(self._tables) >= MAX_TABLES:
                self._tables.clear()
            hit = self._tables[key] = (self.ctx.backend.from_host(table), sum(sizes), max(sizes))
        return hit

    def _launch(self, name: str, pools: list, block_ids: DeviceArray,
                staging: DeviceArray) -> None:
        n = block_ids.size
        if not n or not pools:
            return
        table, row_bytes, widest = self._table(pools)
        if block_ids.dtype != np.int32:
            raise ValueError(f"{name}: block_ids must be int32, got {block_ids.dtype}")
        if staging.dtype != np.uint8 or staging.shape != (n, row_bytes):
            raise ValueError(f"{name}: staging rows must be uint8 [{n}, {row_bytes}], got "
                             f"{staging.dtype} {list(staging.shape)}")
        parts = min(1024, max(1, -(-widest // PART_BYTES)))
        self.ctx.launch(self.ctx.kernel("copy", None, name), (n, len(pools), parts), 256,
                        table, block_ids, staging, np.uint64(row_bytes))

    def gather_blocks(self, pools: list, block_ids: DeviceArray, out: DeviceArray) -> None:
        """Entries ``block_ids`` of every pool into the rows of ``out`` (see
        :func:`atlas_core.ops.block_copy.gather_blocks`)."""
        self._launch("gather_blocks", pools, block_ids, out)

    def scatter_blocks(self, rows: DeviceArray, block_ids: DeviceArray, pools: list) -> None:
        """The rows of ``rows`` into entries ``block_ids`` of every pool (see
        :func:`atlas_core.ops.block_copy.scatter_blocks`)."""
        self._launch("scatter_blocks", pools, block_ids, rows)
