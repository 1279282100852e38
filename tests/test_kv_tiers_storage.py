"""The pieces under the KV tiers: the block record format, the disk tier's LRU bound and write
failures, leftover temporary files, the stats carried to /metrics, and `atlas serve`'s start-up
checks of the offload directory."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from atlas_core.cli import main
from atlas_core.engine import kv_tier_setup
from atlas_core.engine.kv_block_io import KVBlockIO, block_runs
from atlas_core.engine.kv_disk import DiskTier
from atlas_core.engine.kv_tier_setup import with_tier_stats
from atlas_core.engine.kv_tiers import KVTiers
from atlas_core.engine.outputs import EngineStats
from atlas_core.storage.kv_record import CorruptRecord, pack_record, unpack_record
from atlas_core.storage.memory import MemoryStorage
from atlas_core.storage.posix import PosixStorage

H = bytes(range(16))


def test_record_round_trip_and_every_kind_of_damage():
    payload = np.arange(100, dtype=np.float32)
    record = pack_record(H, payload)
    assert bytes(unpack_record(H, record, payload.nbytes)) == payload.tobytes()
    flipped = bytearray(record)
    flipped[-3] ^= 1
    damaged = {"torn": record[:-1], "long": record + b"\0", "bit flip": bytes(flipped),
               "foreign": b"x" * len(record)}
    for name, data in damaged.items():
        with pytest.raises(CorruptRecord):
            unpack_record(H, data, payload.nbytes)
    with pytest.raises(CorruptRecord, match="another block"):
        unpack_record(bytes(16), record, payload.nbytes)


class _FailingStorage(MemoryStorage):
    async def write(self, key, data):
        raise OSError(28, "No space left on device")


def _wait_writes(disk: DiskTier) -> None:
    while disk.writes:
        time.sleep(0.005)
        disk.poll()


def test_disk_tier_is_bounded_least_recently_used_first():
    storage = MemoryStorage()
    disk = DiskTier(storage, payload_size=100, capacity_bytes=3 * (100 + 64))
    keys = [bytes([i]) * 16 for i in range(5)]
    try:
        for h in keys[:3]:
            disk.write(h, bytes(100))
        _wait_writes(disk)
        disk.write(keys[0], bytes(100))          # present: refreshed, not rewritten
        for h in keys[3:]:
            disk.write(h, bytes(100))
        _wait_writes(disk)
        disk.runner.submit(asyncio.sleep(0)).result(5)
        assert list(disk.index) == [keys[0], keys[3], keys[4]]
        assert sorted(storage.keys()) == sorted(h.hex() for h in disk.index)
        assert disk.used_bytes == 3 * 164
    finally:
        disk.close()


def test_failed_writes_are_counted_then_writing_stops():
    disk = DiskTier(_FailingStorage(), payload_size=10, capacity_bytes=1 << 20)
    try:
        for i in range(10):
            disk.write(bytes([i]) * 16, bytes(10))
            _wait_writes(disk)
        assert disk.num_write_failures == 8 and not disk.is_writable and not disk.index
    finally:
        disk.close()


def test_temp_files_of_dead_writers_go_live_ones_stay(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f".abc.{dead.pid}.0f.tmp").write_bytes(b"torn")
    (tmp_path / f".abc.{os.getpid()}.0f.tmp").write_bytes(b"in flight")
    (tmp_path / "abc").write_bytes(b"whole")
    storage = PosixStorage(tmp_path)
    assert storage.num_torn_writes == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".abc.{os.getpid()}.0f.tmp", "abc"]


def test_block_runs_coalesce_consecutive_ids():
    assert block_runs([3, 4, 5, 9, 1, 2]) == [(3, 3, 0), (9, 1, 3), (1, 2, 4)]


def test_host_tier_is_bounded_and_spill_skips_what_it_holds():
    from atlas_core.plugins import Registry
    backend = Registry().create("gpu_backends", "numpy")
    pools = [backend.from_host(np.arange(8 * 4, dtype=np.float32).reshape(8, 4))]
    io = KVBlockIO(backend, pools)
    tiers = KVTiers(io, host_bytes=2 * io.block_bytes, disk=None)
    tiers.spill([(0, b"a"), (1, b"b")])
    tiers.spill([(0, b"a"), (2, b"c")])            # a refreshed; b is the oldest, out
    assert list(tiers.host) == [b"a", b"c"]
    payloads = tiers.take([b"a", b"c", b"b"])
    io.write([6, 7], payloads)
    np.testing.assert_array_equal(backend.to_host(pools[0])[6:], [[0, 1, 2, 3], [8, 9, 10, 11]])
    assert tiers.stats()["host"]["hits"] == 2 and "disk" not in tiers.stats()


def test_tier_stats_keep_the_other_stats():
    class Tiers:
        def stats(self):
            return {"host": {"hits": 3}}
    stats = with_tier_stats(EngineStats(num_running=2, decode_steps=7), Tiers())
    kept = dataclasses.replace(stats, is_alive=False)
    assert kept.decode_steps == 7 and kept.num_running == 2
    assert kept.kv_tiers == {"host": {"hits": 3}}
    assert with_tier_stats(stats, None) is stats


def test_serve_refuses_an_unwritable_offload_dir_before_listening(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["serve", "--port", "0", "--kv-offload-dir", str(blocker / "kv")]) == 2
    err = capsys.readouterr().err
    assert "--kv-offload-dir" in err and "is not writable" in err


def test_serve_refuses_negative_sizes(capsys):
    assert main(["serve", "--port", "0", "--kv-host-gb", "-1"]) == 2
    assert "--kv-host-gb must be >= 0" in capsys.readouterr().err


def test_a_full_offload_dir_is_a_startup_error(tmp_path, monkeypatch):
    class Usage:
        free = 1 << 20
    monkeypatch.setattr(kv_tier_setup.shutil, "disk_usage", lambda path: Usage())

    class Args:
        kv_offload_gb = 1.0
    with pytest.raises(ValueError, match=r"is full \(1 MiB free\)"):
        kv_tier_setup._disk_capacity(Args(), tmp_path, MemoryStorage())


def test_closing_twice_is_harmless():
    disk = DiskTier(MemoryStorage(), payload_size=10, capacity_bytes=1 << 20)
    disk.write(H, bytes(10))
    disk.close()
    disk.close()
    assert disk.index == {H: None}
