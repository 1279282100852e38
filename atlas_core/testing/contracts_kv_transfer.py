"""Contract tests of the KV tiers' transfers on a backend (mixed into ``GpuBackendContract``):
``empty_pinned`` and the async host copies, and :class:`~atlas_core.engine.kv_block_io.KVBlockIO`
/ :class:`~atlas_core.engine.kv_tiers.KVTiers` round trips over the backend's ``gather_blocks``
and ``scatter_blocks`` ops: a hybrid-like pool layout (rows of 32 KiB, 256 KiB, 60 and 6
bytes), block ids out of order, several staging chunks, pinned and pageable host rows; events
after the copies; a disk round trip read into the host tier's rows without a synchronize."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.ops._dtypes import bfloat16
from atlas_core.ops.block_copy import gather_blocks, scatter_blocks

#: (row shape, dtype) of each pool.
LAYOUT = [((16, 8, 128), bfloat16)] * 4 + [((64, 1024), np.dtype(np.float32)),
                                           ((3, 5), np.dtype(np.float32)),
                                           ((3,), np.dtype(np.float16))]
NUM_BLOCKS = 24


def _pools(backend, seed: int) -> list:
    pools = []
    for i, (shape, dtype) in enumerate(LAYOUT):
        pool = backend.empty((NUM_BLOCKS, *shape), dtype)
        backend.fill_random(pool, seed + i, 1.0)
        pools.append(pool)
    return pools


def _bytes(backend, pool) -> np.ndarray:
    return backend.to_host(pool).reshape(NUM_BLOCKS, -1).view(np.uint8)


class KVTransferContract:
    """Pinned host memory, async copies and the KV tiers' block transfers."""

    def test_pinned_host_arrays_and_async_copies(self, backend):
        pinned = backend.empty_pinned((4, 5000), np.uint8)
        assert pinned.shape == (4, 5000) and pinned.dtype == np.uint8
        pinned[:] = np.random.default_rng(3).integers(0, 255, pinned.shape, dtype=np.uint8)
        dev = backend.empty((4, 5000), np.uint8)
        backend.copy_from_host_async(dev, pinned)
        backend.synchronize()
        np.testing.assert_array_equal(backend.to_host(dev), pinned)
        back = backend.empty_pinned((5000,), np.uint8)
        backend.copy_to_host_async(back, dev[1])
        pageable = np.empty(5000, np.uint8)
        backend.copy_to_host_async(pageable, dev[3])
        backend.synchronize()
        np.testing.assert_array_equal(back, pinned[1])
        np.testing.assert_array_equal(pageable, pinned[3])
        backend.copy_from_host_async(dev[0], pinned[2].copy())
        backend.synchronize()
        np.testing.assert_array_equal(backend.to_host(dev[0]), pinned[2])

    def test_events_complete_after_the_copies_before_them(self, backend):
        pinned = backend.empty_pinned((2, 1 << 20), np.uint8)
        pinned[0] = 5
        dev = backend.empty((2, 1 << 20), np.uint8)
        backend.copy_from_host_async(dev[0], pinned[0])
        backend.copy_(dev[1], dev[0])
        backend.copy_to_host_async(pinned[1], dev[1])
        event = backend.record_event()
        assert event.query() in (True, False)
        event.wait()
        assert event.query() and (pinned[1] == 5).all()
        event.wait()                                   # waiting again returns at once

    @pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pageable"])
    def test_kv_block_io_round_trip(self, backend, pinned):
        from atlas_core.engine.kv_block_io import KVBlockIO
        pools = _pools(backend, seed=10)
        block_bytes = sum(p.nbytes // NUM_BLOCKS for p in pools)
        io = KVBlockIO(backend, pools, staging_bytes=5 * block_bytes)
        assert io.staging_rows == 5 and io.block_bytes == block_bytes
        host = [_bytes(backend, p) for p in pools]
        src = np.random.default_rng(4).permutation(NUM_BLOCKS)[:13].tolist()
        empty = backend.empty_pinned if pinned else np.empty
        rows = empty((len(src), block_bytes), np.uint8)
        io.read_into(src, list(rows))
        want = np.empty_like(rows)
        gather_blocks(host, np.asarray(src, np.int32), want)
        np.testing.assert_array_equal(rows, want)
        dst = np.random.default_rng(5).permutation(NUM_BLOCKS)[:13].tolist()
        io.write(dst, list(rows))
        scatter_blocks(want, np.asarray(dst, np.int32), host)
        for p, h in zip(pools, host):
            np.testing.assert_array_equal(_bytes(backend, p), h)
        later = empty((len(src), block_bytes), np.uint8)
        io.read_into_async(dst, list(later)).wait()        # an event, no synchronize
        np.testing.assert_array_equal(later, rows)
        io.write_async(src, list(later[::-1])).wait()
        scatter_blocks(want[::-1].copy(), np.asarray(src, np.int32), host)
        for p, h in zip(pools, host):
            np.testing.assert_array_equal(_bytes(backend, p), h)

    def test_host_tier_spill_and_restore(self, backend):
        from atlas_core.engine.kv_block_io import KVBlockIO
        from atlas_core.engine.kv_tiers import KVTiers
        pools = _pools(backend, seed=20)
        io = KVBlockIO(backend, pools, staging_bytes=4 * sum(p.nbytes // NUM_BLOCKS for p in pools))
        tiers = KVTiers(io, host_bytes=10 * io.block_bytes, disk=None)
        blocks = [3, 9, 4, 5, 6, 7, 20, 8, 1, 0]
        hashes = [b.to_bytes(16, "little") for b in blocks]
        before = io.read(blocks)
        tiers.spill(list(zip(blocks, hashes)))
        targets = [23, 11, 12, 13, 2, 15, 16, 17, 22, 19]
        tiers.write(targets, tiers.take(hashes))
        assert all((a == b).all() for a, b in zip(io.read(targets), before))
        assert tiers.stats()["host"]["hits"] == len(blocks)

    def test_disk_restore_into_host_rows_never_synchronizes(self, backend, tmp_path,
                                                             monkeypatch):
        from atlas_core.engine.kv_block_io import KVBlockIO
        from atlas_core.engine.kv_disk import DiskTier
        from atlas_core.engine.kv_tier_setup import create_storage
        from atlas_core.engine.kv_tiers import KVTiers
        pools = _pools(backend, seed=30)
        io = KVBlockIO(backend, pools, staging_bytes=3 * sum(p.nbytes // NUM_BLOCKS
                                                             for p in pools))
        host = [_bytes(backend, p) for p in pools]
        tiers = KVTiers(io, 16 * io.block_bytes,
                        DiskTier(create_storage("auto", tmp_path), io.block_bytes, 1 << 30))
        hashes = [bytes([i + 1]) * 16 for i in range(8)]

        def no_sync():
            raise AssertionError("the KV tiers synchronized the device")
        monkeypatch.setattr(backend, "synchronize", no_sync)
        try:
            tiers.spill(list(zip(range(8), hashes)))  # the disk writes wait on its event
            tiers.disk.flush(30)
            tiers.clear_memory()
            tiers.prefetch(hashes)
            while tiers.disk.reads:
                tiers.wait_reads()
            tiers.poll()
            assert sorted(tiers.staged_rows) == sorted(hashes)   # read into the host rows
            pinned = getattr(backend, "pinned", None)
            for row in tiers.staged_rows.values():
                buf = tiers.arena.record_buffer(row)
                assert buf.ctypes.data % 4096 == 0
                assert pinned is None or pinned.holds(buf)
            tiers.write(list(range(14, 22)), tiers.take(hashes)).wait()
            monkeypatch.undo()
            for p, h in zip(pools, host):
                np.testing.assert_array_equal(_bytes(backend, p)[14:22], h[:8])
            assert tiers.stats()["disk"]["hits"] == 8 and tiers.stats()["disk"]["corrupt"] == 0
        finally:
            monkeypatch.undo()
            tiers.close()
