"""The ``io_uring`` StorageBackend: one file per block, O_DIRECT reads and writes through a ring.

A worker thread owns the :class:`~atlas_iouring.ring.Ring`. Coroutines queue requests and await
futures; the worker pushes every queued request it has room for, submits them with one system
call, and completes futures as completions arrive, so many reads and writes are in flight at
once. Files bypass the page cache (``O_DIRECT``) through page-aligned buffers, reused from
request to request (a fresh buffer faults in every page, which costs more than the copy into
it); where a file system refuses O_DIRECT (tmpfs) the same request runs buffered.
:meth:`IoUringStorage.read_into` reads into the caller's buffer instead, with no copy at all
when that buffer is page-aligned and spans the file's length rounded up to whole pages (the KV
tiers' page-locked host rows are laid out so). Writes go to
a temporary file that is renamed over the block's name once complete, so a crash never leaves a
half-written block under a real key. The file names are those of the ``posix`` backend, so either backend
reads what the other wrote.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import os
import queue
import threading
from collections import deque
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from atlas_core.api import BlockDirectory, temp_name

from atlas_iouring.ring import (IORING_OP_READ, IORING_OP_WRITE, IoUringUnavailable, Ring,
                                aligned_buffer)

log = logging.getLogger(__name__)

_O_DIRECT = getattr(os, "O_DIRECT", 0)
#: Idle aligned buffers kept for the next requests: per request the ring holds in flight, this
#: many bytes (a KV block of qwen3-8b is 2.4 MB).
POOL_BYTES_PER_ENTRY = 4 << 20


def _read_rest(path: Path, view: memoryview, offset: int) -> int:
    # Bytes of ``path`` from ``offset`` into ``view``, buffered: what follows a short O_DIRECT
    # read (whose fd would refuse an unaligned offset). Returns how many.
    done = 0
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        while done < view.nbytes:
            n = f.readinto(view[done:])
            if not n:
                break
            done += n
    return done


def _open(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | _O_DIRECT, 0o644)
    except OSError as exc:
        if exc.errno != errno.EINVAL or not _O_DIRECT:
            raise
        return os.open(path, flags, 0o644)


class BufferPool:
    """Page-aligned buffers by size, kept for reuse up to ``max_bytes`` idle (one thread)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.idle: dict[int, list[tuple[Any, int]]] = {}
        self.idle_bytes = 0

    def take(self, size: int) -> tuple[Any, int]:
        """``(buffer, address)`` of at least ``size`` bytes (rounded up to whole pages)."""
        size = max(4096, -(-size // 4096) * 4096)
        free = self.idle.get(size)
        if free:
            self.idle_bytes -= size
            return free.pop()
        return aligned_buffer(size)

    def give(self, buf: tuple[Any, int]) -> None:
        """Hand a buffer of :meth:`take` back."""
        size = len(buf[0])
        if self.idle_bytes + size > self.max_bytes:
            buf[0].close()
            return
        self.idle.setdefault(size, []).append(buf)
        self.idle_bytes += size

    def close(self) -> None:
        for free in self.idle.values():
            for buf, _ in free:
                buf.close()
        self.idle.clear()
        self.idle_bytes = 0


class _Request:
    """One read or write: its file, aligned buffer and future."""

    def __init__(self, kind: str, path: Path, data: Any = None,
                 into: memoryview | None = None) -> None:
        self.kind, self.path, self.data, self.into = kind, path, data, into
        self.future: Future = Future()
        self.fd = -1
        self.tmp: Path | None = None
        self.buf: tuple[Any, int] | None = None
        self.pool: BufferPool | None = None

    def prepare(self, pool: BufferPool) -> tuple[int, int, int, int]:
        """Open the file and fill a buffer of ``pool`` (a read into a caller's aligned buffer
        needs none); ``(opcode, fd, addr, length)``."""
        self.pool = pool
        if self.kind == "read":
            self.fd = _open(self.path, os.O_RDONLY)
            self.size = os.fstat(self.fd).st_size
            into = self.into
            if into is not None:
                if self.size > into.nbytes:
                    raise BufferError(f"{self.path} is {self.size} bytes, the buffer "
                                      f"{into.nbytes}")
                addr = ctypes.addressof(ctypes.c_char.from_buffer(into))
                length = -(-self.size // 4096) * 4096
                if addr % 4096 == 0 and length <= into.nbytes:
                    return IORING_OP_READ, self.fd, addr, length
            self.buf = pool.take(self.size)
            return IORING_OP_READ, self.fd, self.buf[1], len(self.buf[0])
        self.tmp = self.path.with_name(temp_name(self.path.name))
        self.fd = _open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self.size = len(self.data)
        self.buf = pool.take(self.size)
        self.buf[0][:self.size] = self.data
        self.data = None
        return IORING_OP_WRITE, self.fd, self.buf[1], len(self.buf[0])

    def finish(self, res: int) -> None:
        """Complete the future from the ring's result (bytes moved, or -errno)."""
        try:
            if res < 0:
                raise OSError(-res, f"{os.strerror(-res)}: {self.path}")
            if self.kind == "read" and self.into is not None:
                n = min(res, self.size)
                if self.buf is not None:  # not aligned: read through a pool buffer
                    with memoryview(self.buf[0]) as staged:
                        self.into[:n] = staged[:n]
                if n < self.size:
                    n += _read_rest(self.path, self.into[n:self.size], n)
                self.future.set_result(n)
                return
            buf = self.buf[0]
            if self.kind == "read":
                data = buf[:min(res, self.size)]
                if res < self.size:
                    data += os.pread(self.fd, self.size - res, res)
                self.future.set_result(data)
            else:
                if res < len(buf):
                    os.pwrite(self.fd, buf[res:self.size], res)
                os.ftruncate(self.fd, self.size)
                os.replace(self.tmp, self.path)
                self.future.set_result(None)
        except BaseException as exc:  # noqa: BLE001 - every failure goes to the waiting caller
            self.fail(exc)
        finally:
            self.close()

    def fail(self, exc: BaseException) -> None:
        self.close()
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)
        if not self.future.done():
            self.future.set_exception(exc)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.buf is not None:
            self.pool.give(self.buf)
            self.buf = None


class IoUringStorage(BlockDirectory):
    """Blocks as files under ``root``, moved by io_uring.

    Args:
        root: directory to keep blocks in (created if missing).
        entries: requests in flight at once.
        **options: other factory options are ignored.

    Raises:
        IoUringUnavailable: the kernel refuses io_uring (use :func:`create_storage` for the
            posix fallback).
    """

    def __init__(self, root: str | os.PathLike, entries: int = 128, **options: Any) -> None:
        self.ring = Ring(entries)
        self.buffers = BufferPool(self.ring.entries * POOL_BYTES_PER_ENTRY)
        super().__init__(root)
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.num_submit_calls = 0
        self.max_in_flight = 0
        self._thread = threading.Thread(target=self._run, name="atlas-io-uring", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        ring, waiting, active = self.ring, deque(), {}
        while True:
            block = not active and not waiting
            try:
                while True:
                    req = self.requests.get(block=block)
                    block = False
                    if req is None:
                        return self._drain(active, waiting)
                    waiting.append(req)
            except queue.Empty:
                pass
            while waiting and ring.num_free:
                req = waiting.popleft()
                try:
                    opcode, fd, addr, length = req.prepare(self.buffers)
                except (OSError, BufferError) as exc:
                    req.fail(KeyError(f"no stored block in {req.path}")
                             if getattr(exc, "errno", None) == errno.ENOENT
                             and req.kind == "read" else exc)
                    continue
                ring.push(opcode, fd, addr, length, 0, id(req))
                active[id(req)] = req
            if active:
                ring.submit(wait=1)
                self.num_submit_calls += 1
                self.max_in_flight = max(self.max_in_flight, ring.num_in_flight)
                for user_data, res in ring.reap():
                    active.pop(user_data).finish(res)

    def _drain(self, active: dict, waiting: deque) -> None:
        while active:
            self.ring.submit(wait=1)
            for user_data, res in self.ring.reap():
                active.pop(user_data).finish(res)
        for req in waiting:
            req.fail(RuntimeError("io_uring storage closed"))

    async def _do(self, req: _Request):
        if not self._thread.is_alive():
            raise RuntimeError("io_uring storage is closed")
        self.requests.put(req)
        return await asyncio.wrap_future(req.future)

    async def write(self, key: str, data: bytes) -> None:
        # The worker copies ``data`` into an aligned buffer before this coroutine completes.
        await self._do(_Request("write", self._path(key), memoryview(data).cast("B")))

    async def read(self, key: str) -> bytes:
        try:
            return await self._do(_Request("read", self._path(key)))
        except KeyError:
            raise KeyError(f"no stored block under key {key!r} in {self.root}") from None

    async def read_into(self, key: str, buffer: memoryview) -> int:
        """Into ``buffer`` by O_DIRECT with no copy when it is page-aligned and spans the file
        rounded up to whole pages, else through an aligned pool buffer (one copy)."""
        view = memoryview(buffer).cast("B")
        if view.readonly:
            raise TypeError("read_into needs a writable buffer")
        try:
            return await self._do(_Request("read", self._path(key), into=view))
        except KeyError:
            raise KeyError(f"no stored block under key {key!r} in {self.root}") from None

    def close(self) -> None:
        if self._thread.is_alive():
            self.requests.put(None)
            self._thread.join(30)
            self.ring.close()
            self.buffers.close()


def create_storage(root: str | os.PathLike | None = None, **options: Any) -> StorageBackend:
    """The ``io_uring`` factory: :class:`IoUringStorage`, or the ``posix`` backend (with a
    warning saying why) where the kernel refuses io_uring, e.g. in a container whose seccomp
    profile blocks it."""
    from atlas_core.api import Registry
    if root is None:
        raise ValueError("the io_uring storage backend needs a root directory")
    try:
        return IoUringStorage(root, **options)
    except IoUringUnavailable as exc:
        log.warning("io_uring is unavailable here (%s; containers with the default seccomp "
                    "profile block it); KV blocks go through the posix storage backend "
                    "instead", exc.strerror or exc)
        return Registry().create("storage_backends", "posix", root=str(root), **options)
