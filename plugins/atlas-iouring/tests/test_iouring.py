"""The io_uring StorageBackend: the storage contract, O_DIRECT batches with many requests in
flight, crash-safe writes, interoperability with the posix backend, and the posix fallback where
the kernel refuses io_uring."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os

import pytest

from atlas_core.api import Registry, make_plugin_manager
from atlas_core.testing.contracts import StorageBackendContract

from atlas_iouring import ring, storage
from atlas_iouring.storage import IoUringStorage


def _io_uring_refusal() -> str | None:
    try:
        ring.Ring(4).close()
    except ring.IoUringUnavailable as exc:
        return str(exc)
    return None


REFUSED = _io_uring_refusal()
needs_io_uring = pytest.mark.skipif(
    REFUSED is not None, reason=f"the kernel refuses io_uring here ({REFUSED}); the fallback "
    "test covers this machine")


@needs_io_uring
class TestIoUringStorage(StorageBackendContract):
    storage_name = "io_uring"

    def test_it_is_the_io_uring_backend(self, storage):
        assert isinstance(storage, IoUringStorage)


def test_registered_lazily_under_io_uring():
    registry = Registry(make_plugin_manager(allow=["iouring"]))
    assert "io_uring" in registry.names("storage_backends")


@needs_io_uring
def test_many_blocks_in_flight_batched_and_exact(tmp_path):
    store = IoUringStorage(tmp_path, entries=32)
    blocks = {f"{i:032x}": os.urandom(5000 + 4096 * (i % 3)) for i in range(200)}

    async def roundtrip():
        await asyncio.gather(*(store.write(k, v) for k, v in blocks.items()))
        return await asyncio.gather(*(store.read(k) for k in blocks))
    try:
        assert asyncio.run(roundtrip()) == list(blocks.values())
        assert store.max_in_flight > 1
        assert store.num_submit_calls < 2 * 2 * len(blocks)
        assert not list(tmp_path.glob(".*.tmp"))
        assert store.used_bytes() == sum(map(len, blocks.values()))
        assert store.buffers.idle_bytes > 0           # kept for the next requests
    finally:
        store.close()


def test_buffer_pool_reuses_page_aligned_buffers_up_to_its_cap():
    pool = storage.BufferPool(max_bytes=3 * 8192)
    a, b, c = pool.take(5000), pool.take(8192), pool.take(100)
    assert [len(x[0]) for x in (a, b, c)] == [8192, 8192, 4096]
    assert all(x[1] % 4096 == 0 for x in (a, b, c))
    pool.give(a)
    pool.give(c)
    pool.give(b)
    assert pool.idle_bytes == 8192 + 4096 + 8192
    assert pool.take(6000) is b and pool.take(4000) is c
    pool.give(b)
    extra = pool.take(16384)
    pool.give(extra)                                  # past the cap: unmapped
    assert pool.idle_bytes == 2 * 8192 and extra[0].closed
    pool.close()
    assert pool.idle_bytes == 0 and a[0].closed and b[0].closed


@needs_io_uring
def test_reads_what_posix_wrote_and_the_other_way(tmp_path):
    registry = Registry()
    posix = registry.create("storage_backends", "posix", root=str(tmp_path))
    store = IoUringStorage(tmp_path)
    try:
        asyncio.run(posix.write("from-posix", b"p" * 10_000))
        asyncio.run(store.write("from-uring", b"u" * 10_000))
        assert asyncio.run(store.read("from-posix")) == b"p" * 10_000
        assert asyncio.run(posix.read("from-uring")) == b"u" * 10_000
    finally:
        store.close()


@needs_io_uring
def test_a_failed_write_raises_and_leaves_nothing(tmp_path):
    root = tmp_path / "blocks"
    store = IoUringStorage(root)
    try:
        with pytest.raises(ValueError, match="too long"):
            asyncio.run(store.write("k" * 500, b"x"))
        root.rmdir()
        with pytest.raises(FileNotFoundError):
            asyncio.run(store.write("k", b"x"))
        root.mkdir()
        with pytest.raises(KeyError, match="no stored block"):
            asyncio.run(store.read("k"))
        assert not list(root.iterdir())
    finally:
        store.close()


def test_files_are_opened_with_o_direct_where_the_file_system_allows(tmp_path):
    fd = storage._open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT)
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    finally:
        os.close(fd)
    if not flags & os.O_DIRECT:
        pytest.skip(f"the file system of {tmp_path} refuses O_DIRECT (tmpfs?)")
    assert flags & os.O_DIRECT


def test_falls_back_to_posix_where_io_uring_is_refused(tmp_path, monkeypatch, caplog):
    def refused(entries=128):
        raise ring.IoUringUnavailable(1, "io_uring_setup failed: Operation not permitted")
    monkeypatch.setattr(storage, "Ring", refused)
    with caplog.at_level(logging.WARNING, logger="atlas_iouring.storage"):
        store = Registry().create("storage_backends", "io_uring", root=str(tmp_path))
    assert type(store).__name__ == "PosixStorage"
    assert "io_uring is unavailable here" in caplog.text and "posix" in caplog.text
    asyncio.run(store.write("k", b"still works"))
    assert asyncio.run(store.read("k")) == b"still works"
