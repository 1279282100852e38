"""KVBlockIO moves blocks a chunk at a time (one gather / scatter launch per chunk, one copy per
block), for pools of any dtypes and row sizes, block ids in any order; the host tier's rows are
never reused while a restore or a disk write still reads them; checksums run off the storage
loop."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from atlas_core.engine import kv_disk
from atlas_core.engine.kv_block_io import KVBlockIO
from atlas_core.engine.kv_disk import DiskTier
from atlas_core.engine.kv_host_arena import HostArena
from atlas_core.engine.kv_tiers import KVTiers
from atlas_core.plugins import Registry
from atlas_core.storage.kv_record import unpack_record
from atlas_core.storage.memory import MemoryStorage

#: (row shape, dtype) of hybrid-like pools: rows of 24, 6, 512 and 64 bytes.
POOLS = [((3, 2), "float32"), ((3,), "float16"), ((2, 4, 16), "float32"), ((4, 8), "bfloat16")]
NUM_BLOCKS = 10


def _setup(backend_name: str, staging_blocks: int = 3):
    backend = Registry().create("gpu_backends", backend_name)
    rng = np.random.default_rng(0)
    pools = []
    for shape, dtype in POOLS:
        host = rng.standard_normal((NUM_BLOCKS, *shape)).astype(np.float32).astype(
            np.dtype(backend.empty((1,), dtype).dtype))
        pools.append(backend.from_host(host))
    block_bytes = sum(int(np.prod(s)) * np.dtype(p.dtype).itemsize
                      for (s, _), p in zip(POOLS, pools))
    return backend, pools, KVBlockIO(backend, pools, staging_bytes=staging_blocks * block_bytes)


def _block(backend, pools, b: int) -> bytes:
    return b"".join(backend.to_host(p)[b].tobytes() for p in pools)


@pytest.mark.parametrize("backend_name", ["numpy", "mock"])
def test_round_trip_of_hybrid_pools_out_of_order_across_chunks(backend_name):
    backend, pools, io = _setup(backend_name)
    assert io.staging_rows == 3 and io.block_bytes == 24 + 6 + 512 + 64
    before = [_block(backend, pools, b) for b in range(NUM_BLOCKS)]
    src = [7, 2, 9, 0, 4, 5, 3]                      # 3 chunks, the last one short
    rows = backend.empty_pinned((len(src), io.block_bytes), np.uint8)
    io.read_into(src, list(rows))
    assert [r.tobytes() for r in rows] == [before[b] for b in src]
    assert [r.tobytes() for r in io.read(src)] == [before[b] for b in src]
    dst = [1, 8, 6, 3, 0, 2, 9]
    payloads = [rows[0].tobytes(), memoryview(rows[1]), *rows[2:]]   # any bytes-like
    io.write(dst, payloads)
    after = [_block(backend, pools, b) for b in range(NUM_BLOCKS)]
    for b, s in zip(dst, src):
        assert after[b] == before[s]
    untouched = set(range(NUM_BLOCKS)) - set(dst)
    assert all(after[b] == before[b] for b in untouched)


def test_one_gather_or_scatter_launch_per_chunk_and_one_copy_per_block():
    backend, pools, io = _setup("mock", staging_blocks=4)
    blocks = [9, 1, 5, 3, 8, 0, 2, 6, 4]             # 3 chunks of at most 4
    with backend.record() as rec:
        payloads = io.read(blocks)
    assert rec.count("launch", "gather_blocks") == 3 and rec.count("launch") == 3
    assert rec.count("d2h") == len(blocks)
    with backend.record() as rec:
        io.write(blocks, payloads)
    assert rec.count("launch", "scatter_blocks") == 3 and rec.count("launch") == 3
    assert rec.count("h2d") == len(blocks) + 3        # the payloads, and each chunk's ids


def test_wrong_sizes_are_refused():
    _, _, io = _setup("numpy")
    with pytest.raises(ValueError, match="a payload of 5 bytes"):
        io.write([1], [b"12345"])
    with pytest.raises(ValueError, match="2 blocks into 1 host rows"):
        io.read_into([1, 2], [np.empty(io.block_bytes, np.uint8)])


def test_host_arena_grows_by_segment_and_reuses_rows():
    backend = Registry().create("gpu_backends", "numpy")
    arena = HostArena(backend, row_bytes=100, capacity=5, segment_bytes=250, align=1)
    rows = [arena.take() for _ in range(5)]
    assert rows == [0, 1, 2, 3, 4] and arena.take() is None
    assert [s.shape for s in arena.segments] == [(2, 100), (2, 100), (1, 100)]
    arena.row(3)[:] = 7
    assert (arena.segments[1][1] == 7).all()
    arena.give(3)
    assert arena.take() == 3 and arena.take() is None


def test_host_arena_rows_are_page_aligned_and_padded_for_o_direct():
    backend = Registry().create("gpu_backends", "numpy")
    arena = HostArena(backend, row_bytes=64 + 10_000, capacity=5, segment_bytes=3 * 12288)
    rows = [arena.take() for _ in range(5)]
    assert arena.stride == 12288 and arena.rows_per_segment == 3
    for r in rows:
        buf = arena.record_buffer(r)
        assert buf.ctypes.data % 4096 == 0 and buf.nbytes == 12288
        assert arena.row(r).nbytes == 10_064 and arena.row(r).ctypes.data == buf.ctypes.data
    arena.row(4)[:] = 9
    assert (arena.record_buffer(4)[:10_064] == 9).all() and not (arena.row(3) == 9).all()


def test_rows_handed_out_by_take_survive_a_spill_before_the_restore():
    backend, pools, io = _setup("numpy")
    tiers = KVTiers(io, 2 * io.block_bytes, disk=None)
    want = [_block(backend, pools, b) for b in (0, 1)]
    tiers.spill([(0, b"a"), (1, b"b")])
    payloads = tiers.take([b"a", b"b"])
    tiers.spill([(2, b"c"), (3, b"d")])              # blocks evicted to make room: no rows
    assert list(tiers.host) == [b"a", b"b"]
    tiers.write([8, 9], payloads)
    assert [_block(backend, pools, b) for b in (8, 9)] == want
    tiers.spill([(4, b"e")])                         # restored: their rows may be reused
    assert list(tiers.host) == [b"b", b"e"]


class _GatedStorage(MemoryStorage):
    """Writes wait until ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    async def write(self, key, data):
        await asyncio.to_thread(self.gate.wait, 10)
        await super().write(key, data)


def test_host_rows_being_written_to_disk_are_not_reused():
    storage = _GatedStorage()
    backend, pools, io = _setup("numpy")
    disk = DiskTier(storage, io.block_bytes, 1 << 20)
    tiers = KVTiers(io, 2 * io.block_bytes, disk)
    want = {h: _block(backend, pools, b) for b, h in ((0, b"a" * 16), (1, b"b" * 16),
                                                      (2, b"c" * 16))}
    try:
        tiers.spill([(0, b"a" * 16), (1, b"b" * 16)])
        tiers.spill([(2, b"c" * 16)])                # both rows are still being written
        assert list(tiers.host) == [b"a" * 16, b"b" * 16] and b"c" * 16 in disk.writes
        storage.gate.set()
        disk.flush(10)
        for h, data in want.items():
            record = asyncio.run(storage.read(h.hex()))
            assert bytes(unpack_record(h, record, io.block_bytes)) == data
        tiers.spill([(3, b"d" * 16)])                # written now: the oldest row is reused
        assert list(tiers.host) == [b"b" * 16, b"d" * 16]
    finally:
        storage.gate.set()
        tiers.close()


def test_blocks_read_from_disk_join_the_host_rows_and_restore_exactly():
    backend, pools, io = _setup("numpy")
    disk = DiskTier(MemoryStorage(), io.block_bytes, 1 << 20)
    tiers = KVTiers(io, 4 * io.block_bytes, disk)
    hashes = [bytes([i]) * 16 for i in range(3)]
    want = [_block(backend, pools, b) for b in (5, 6, 7)]
    try:
        tiers.spill(list(zip([5, 6, 7], hashes)))
        tiers.clear_memory()
        deadline = time.monotonic() + 10
        while tiers.prefetch(hashes) != 3:
            assert time.monotonic() < deadline
            tiers.wait_reads()
        payloads = tiers.take(hashes)
        assert list(tiers.host) == hashes and tiers.stats()["disk"]["hits"] == 3
        assert all(p.base is not None for p in payloads)   # views of host rows
        tiers.write([0, 1, 2], payloads)
        assert [_block(backend, pools, b) for b in (0, 1, 2)] == want
    finally:
        tiers.close()


def test_checksums_are_computed_off_the_storage_loop(monkeypatch):
    threads = []

    def spy(fn):
        def wrapped(*args):
            threads.append(threading.current_thread().name)
            return fn(*args)
        return wrapped
    monkeypatch.setattr(kv_disk, "seal_record", spy(kv_disk.seal_record))
    monkeypatch.setattr(kv_disk, "unpack_record", spy(kv_disk.unpack_record))
    disk = DiskTier(MemoryStorage(), 64, 1 << 20)
    try:
        disk.write(b"h" * 16, bytes(range(64)))
        disk.flush(10)
        assert disk.fetch(b"h" * 16) is None
        while disk.reads:
            disk.wait(1.0)
            done = disk.poll()
        assert bytes(done[b"h" * 16]) == bytes(range(64))
    finally:
        disk.close()
    assert len(threads) == 2 and all(t.startswith("atlas-kv-checksum") for t in threads)
