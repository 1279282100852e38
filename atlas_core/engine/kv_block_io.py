"""KVBlockIO: copies whole KV blocks (or recurrent-state rows) between device pools and host bytes.

A block's host form is one flat ``uint8`` array: for every paged-attention layer in order, the
block's K rows then its V rows (``[block_size, num_kv_heads, head_dim]`` each, in the cache
dtype). Hybrid models' state snapshots move the same way: row ``r`` of every recurrent-state
pool (conv and SSM state of each layer).

Blocks move a chunk at a time through one device staging buffer of ``[rows, block_bytes]``
bytes: a spill gathers a chunk of blocks from every pool into it with one ``gather_blocks`` op
launch, then copies each staging row to its host row; a restore copies each host row into the
staging buffer, then scatters the chunk into the pools with one ``scatter_blocks`` launch. So a
block costs one host<->device copy of its whole payload (straight from or into page-locked
memory where the host rows come from :meth:`~atlas_core.interfaces.GpuBackend.empty_pinned`)
instead of one small copy per pool, and the same code serves every backend.

The ``*_async`` forms return a :class:`~atlas_core.interfaces.DeviceEvent` recorded after the
host copies instead of synchronizing the backend: a spill or restore between steps then never
waits for a step already queued on the device. The device side needs no wait at all (the
pools, the staging buffer and the next step share one queue); the host side waits on the
event before it reads a spilled row or overwrites a restored one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.interfaces import DeviceEvent
from atlas_core.ops.block_copy import pool_row_bytes

#: Bytes of the device staging buffer (a chunk of blocks per op launch).
STAGING_BYTES = 64 << 20


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


def byte_view(payload: Any) -> np.ndarray:
    """``payload`` (an array or any bytes-like object) as a flat ``uint8`` array, no copy."""
    if isinstance(payload, np.ndarray):
        return payload.reshape(-1).view(np.uint8)
    return np.frombuffer(payload, np.uint8)


class KVBlockIO:
    """Reads and writes first-axis entries (blocks, state rows) of a list of device pools.

    Args:
        backend: the GpuBackend owning the pools.
        pools: device arrays indexed by block (or row) on their first axis, e.g.
            :func:`paged_kv_pools` or a model runner's ``state_pools``.
        staging_bytes: size of the device staging buffer (at least one block, at most as many
            blocks as the longest pool holds), allocated here.
    """

    def __init__(self, backend: Any, pools: list, staging_bytes: int = STAGING_BYTES) -> None:
        self.backend = backend
        self.pools = list(pools)
        self.row_bytes = pool_row_bytes(self.pools)
        self.block_bytes = sum(self.row_bytes)
        self.staging_rows = 0
        if self.pools and self.block_bytes:
            most = max(p.shape[0] for p in self.pools)
            self.staging_rows = max(1, min(most, staging_bytes // self.block_bytes))
            # staging: [staging_rows, block_bytes] uint8; ids: [staging_rows] int32
            self.staging = backend.empty((self.staging_rows, self.block_bytes), np.uint8)
            self.ids = backend.empty((self.staging_rows,), np.int32)

    def _chunks(self, blocks: list[int]):
        # (start, count) of each chunk of ``blocks``, its ids uploaded into ``self.ids``.
        if not blocks:
            return
        for start in range(0, len(blocks), self.staging_rows):
            ids = np.asarray(blocks[start:start + self.staging_rows], np.int32)
            self.backend.copy_from_host(self.ids[:len(ids)], ids)
            yield start, len(ids)

    def read(self, blocks: list[int]) -> list[np.ndarray]:
        """Host copies (flat ``uint8``, :attr:`block_bytes` each) of ``blocks``."""
        out = [np.empty(self.block_bytes, np.uint8) for _ in blocks]
        self.read_into(blocks, out)
        return out

    def read_into(self, blocks: list[int], dests: list[np.ndarray]) -> None:
        """Copy ``blocks`` into the host arrays ``dests`` (contiguous, :attr:`block_bytes`
        each; rows of an :meth:`~atlas_core.interfaces.GpuBackend.empty_pinned` array move
        fastest). Returns once every one holds its block."""
        self.read_into_async(blocks, dests).wait()

    def read_into_async(self, blocks: list[int], dests: list[np.ndarray]) -> DeviceEvent:
        """:meth:`read_into` that returns once the copies are queued: ``dests`` hold their
        blocks when the returned event completes (the device pools may be overwritten by work
        queued from now on)."""
        if len(dests) != len(blocks):
            raise ValueError(f"read_into: {len(blocks)} blocks into {len(dests)} host rows")
        for start, n in self._chunks(blocks):
            self.backend.ops.gather_blocks(self.pools, self.ids[:n], self.staging[:n])
            for i in range(n):
                self.backend.copy_to_host_async(dests[start + i], self.staging[i])
        return self.backend.record_event() if blocks else DeviceEvent()

    def write(self, blocks: list[int], payloads: list) -> None:
        """Copy host ``payloads`` (bytes-like, :attr:`block_bytes` each, as made by
        :meth:`read`) into ``blocks``. Returns once the payloads have been read (the caller
        may reuse them)."""
        self.write_async(blocks, payloads).wait()

    def write_async(self, blocks: list[int], payloads: list) -> DeviceEvent:
        """:meth:`write` that returns once the copies are queued: work queued from now on sees
        the blocks written; the caller leaves ``payloads`` unchanged and alive until the
        returned event completes."""
        if len(payloads) != len(blocks):
            raise ValueError(f"write: {len(payloads)} payloads for {len(blocks)} blocks")
        for start, n in self._chunks(blocks):
            for i in range(n):
                payload = byte_view(payloads[start + i])
                if payload.nbytes != self.block_bytes:
                    raise ValueError(f"write: a payload of {payload.nbytes} bytes, blocks have "
                                     f"{self.block_bytes}")
                self.backend.copy_from_host_async(self.staging[i], payload)
            self.backend.ops.scatter_blocks(self.staging[:n], self.ids[:n], self.pools)
        return self.backend.record_event() if blocks else DeviceEvent()
