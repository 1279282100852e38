"""Disk hits read straight into the host tier's page-locked rows and are verified there (posix
and io_uring, and a storage backend without ``read_into`` through the old path); a damaged
record read in place is still counted and never served; spills and restores wait on per-transfer
events, never on a device synchronize, and no row is overwritten by the host or a disk read
before the device copies into or out of it have completed."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.engine.kv_block_io import KVBlockIO
from atlas_core.engine.kv_disk import DiskTier
from atlas_core.engine.kv_tiers import KVTiers
from atlas_core.interfaces import DeviceEvent
from atlas_core.plugins import Registry
from atlas_core.storage.kv_record import HEADER_SIZE, unpack_record
from atlas_core.storage.memory import MemoryStorage
from atlas_core.storage.posix import PosixStorage, key_to_filename

NUM_BLOCKS = 12
#: float32 elements per block: 10,000 bytes, so a record (10,064) is not a whole page
BLOCK_FLOATS = 2500
HASHES = [bytes([i + 1]) * 16 for i in range(4)]


def _io(backend) -> KVBlockIO:
    rng = np.random.default_rng(0)
    pools = [backend.from_host(rng.standard_normal((NUM_BLOCKS, BLOCK_FLOATS // 2), np.float32))
             for _ in range(2)]
    return KVBlockIO(backend, pools, staging_bytes=3 * BLOCK_FLOATS * 4)


def _block(io: KVBlockIO, b: int) -> bytes:
    return b"".join(io.backend.to_host(p)[b].tobytes() for p in io.pools)


def _storage(name: str, root):
    if name == "posix":
        return PosixStorage(root)
    iouring = pytest.importorskip("atlas_iouring.storage")
    ring = pytest.importorskip("atlas_iouring.ring")
    try:
        return iouring.IoUringStorage(root, entries=16)
    except ring.IoUringUnavailable as exc:
        pytest.skip(f"the kernel refuses io_uring here ({exc})")


def _read_all(tiers: KVTiers, hashes: list[bytes]) -> None:
    deadline = time.monotonic() + 10
    tiers.prefetch(hashes)
    while tiers.disk.reads:
        assert time.monotonic() < deadline
        tiers.wait_reads()
    tiers.poll()


def _spilled(io: KVBlockIO, storage, host_blocks: int = 8) -> KVTiers:
    # Blocks 0-3 spilled under HASHES, written to disk, host memory dropped.
    tiers = KVTiers(io, host_blocks * io.block_bytes, DiskTier(storage, io.block_bytes, 1 << 24))
    tiers.spill(list(zip(range(4), HASHES)))
    tiers.disk.flush(10)
    tiers.clear_memory()
    return tiers


@pytest.mark.parametrize("storage_name", ["posix", "io_uring"])
def test_disk_hits_land_in_their_page_locked_rows_and_restore_exactly(tmp_path, storage_name):
    storage = _storage(storage_name, tmp_path)
    io = _io(NumpyBackend())
    want = [_block(io, b) for b in range(4)]
    tiers = _spilled(io, storage)
    bounced = []
    if storage_name == "io_uring":
        take = storage.buffers.take
        storage.buffers.take = lambda size: bounced.append(size) or take(size)
    try:
        _read_all(tiers, HASHES)
        assert sorted(tiers.staged) == HASHES and not tiers.read_rows
        for h in HASHES:
            row = tiers.arena.record_buffer(tiers.staged_rows[h])
            assert row.ctypes.data % 4096 == 0
            assert np.shares_memory(tiers.staged[h], row)            # read in place, no copy
        assert not bounced                                           # O_DIRECT into the rows
        payloads = tiers.take(HASHES)
        assert list(tiers.host) == HASHES and tiers.stats()["disk"]["hits"] == 4
        tiers.write([8, 9, 10, 11], payloads)
        assert [_block(io, b) for b in (8, 9, 10, 11)] == want
    finally:
        tiers.close()


@pytest.mark.parametrize("storage_name", ["posix", "io_uring"])
def test_damaged_records_read_in_place_are_counted_and_never_served(tmp_path, storage_name):
    storage = _storage(storage_name, tmp_path)
    io = _io(NumpyBackend())
    tiers = _spilled(io, storage)
    path = {h: tmp_path / key_to_filename(h.hex()) for h in HASHES}
    data = bytearray(path[HASHES[0]].read_bytes())
    data[HEADER_SIZE + 5000] ^= 0x10
    path[HASHES[0]].write_bytes(bytes(data))                         # a flipped bit
    path[HASHES[1]].write_bytes(path[HASHES[1]].read_bytes()[:7000])  # torn
    path[HASHES[2]].write_bytes(path[HASHES[2]].read_bytes() + bytes(3000))  # past the row
    try:
        _read_all(tiers, HASHES)
        stats = tiers.stats()["disk"]
        assert stats["corrupt"] == 3 and stats["read_failures"] == 0
        assert list(tiers.staged) == [HASHES[3]] and not tiers.read_rows
        assert not any(tiers.disk.contains(h) for h in HASHES[:3])
        assert len(tiers.arena.free) == tiers.arena.num_rows - 1     # their rows came back
        assert tiers.take(HASHES) == []                              # never served
    finally:
        tiers.close()


class _PlainStore:
    """A storage backend outside the StorageBackend ABC, without ``read_into``."""

    num_torn_writes = 0

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    async def write(self, key, data):
        self.data[key] = bytes(data)

    async def read(self, key):
        return self.data[key]

    async def delete(self, key):
        self.data.pop(key, None)

    def contains(self, key):
        return key in self.data

    def keys(self):
        return list(self.data)

    def close(self):
        pass


def test_a_backend_without_read_into_goes_through_the_old_path():
    store = _PlainStore()
    io = _io(NumpyBackend())
    want = [_block(io, b) for b in range(4)]
    tiers = _spilled(io, store)
    key = HASHES[1].hex()
    store.data[key] = store.data[key][:-1] + bytes([store.data[key][-1] ^ 1])
    try:
        _read_all(tiers, HASHES)
        assert tiers.stats()["disk"]["corrupt"] == 1
        payloads = tiers.take(HASHES)
        assert len(payloads) == 1                                    # stops at the bad one
        tiers.write([9], payloads)
        assert _block(io, 9) == want[0]
    finally:
        tiers.close()


class _LateEvent(DeviceEvent):
    """Not complete until waited on: a GPU whose copies are still running."""

    def __init__(self, backend: "_LateBackend") -> None:
        self.backend, self.done = backend, False

    def query(self) -> bool:
        return self.done

    def wait(self) -> None:
        if not self.done:
            self.backend.waited.append(self)
            self.done = True


class _LateBackend(NumpyBackend):
    name = "late-events"

    def __init__(self) -> None:
        super().__init__()
        self.events: list[_LateEvent] = []
        self.waited: list[_LateEvent] = []

    def record_event(self) -> DeviceEvent:
        self.events.append(_LateEvent(self))
        return self.events[-1]

    def synchronize(self) -> None:
        raise AssertionError("the KV tiers synchronized the device")


class _SpyStorage(MemoryStorage):
    """Records, at each read, whether every event recorded so far had completed."""

    def __init__(self, backend: _LateBackend) -> None:
        super().__init__()
        self.backend, self.seen = backend, []

    async def read_into(self, key, buffer):
        self.seen.append(all(e.done for e in self.backend.events))
        return await super().read_into(key, buffer)


def test_a_row_is_not_overwritten_before_the_copies_out_of_it_complete():
    backend = _LateBackend()
    io = _io(backend)
    want = [_block(io, b) for b in range(2)]
    storage = _SpyStorage(backend)
    tiers = KVTiers(io, 2 * io.block_bytes, DiskTier(storage, io.block_bytes, 1 << 24))
    try:
        tiers.spill(list(zip(range(2), HASHES[:2])))                 # event 0: the rows' fill
        tiers.disk.flush(10)                                         # each write waited for it
        assert backend.events[0].done and set(storage.keys()) == {h.hex() for h in HASHES[:2]}
        payloads = tiers.take(HASHES[:2])
        tiers.write([6, 7], payloads)                                # event 1: still reading
        restore = backend.events[1]
        assert not restore.done and tiers._restoring[0][0] is restore   # payloads kept alive
        assert [_block(io, b) for b in (6, 7)] == want
        tiers.clear_memory()                                         # rows free, copy running
        _read_all(tiers, HASHES[:2])                                 # disk reads into them
        assert storage.seen == [True, True] and restore in backend.waited
        assert sorted(tiers.staged) == HASHES[:2]
    finally:
        tiers.close()


class _GatedEvent(DeviceEvent):
    def __init__(self) -> None:
        self.gate = threading.Event()

    def query(self) -> bool:
        return self.gate.is_set()

    def wait(self) -> None:
        assert self.gate.wait(10)


def test_a_spilled_record_is_sealed_only_after_its_device_copy_lands():
    storage = MemoryStorage()
    disk = DiskTier(storage, payload_size=100, capacity_bytes=1 << 20)
    h, ready = b"k" * 16, _GatedEvent()
    record = disk.new_record()
    record[HEADER_SIZE:] = 1
    try:
        disk.write_record(h, record, ready=ready)
        time.sleep(0.2)
        disk.poll()
        assert h in disk.writes and not storage.contains(h.hex())
        record[HEADER_SIZE:] = 7                                     # the copy lands
        ready.gate.set()
        disk.flush(10)
        stored = asyncio.run(storage.read(h.hex()))
        assert bytes(unpack_record(h, stored, 100)) == bytes([7]) * 100
    finally:
        ready.gate.set()
        disk.close()


def test_spills_and_restores_record_events_instead_of_synchronizing():
    backend = Registry().create("gpu_backends", "mock")
    io = _io(backend)
    tiers = KVTiers(io, 4 * io.block_bytes, disk=None)
    with backend.record() as rec:
        tiers.spill(list(zip(range(4), HASHES)))
        tiers.write([8, 9, 10, 11], tiers.take(HASHES))
    assert rec.count("sync") == 0 and rec.count("event") == 2
    assert [_block(io, b) for b in (8, 9, 10, 11)] == [_block(io, b) for b in range(4)]
