"""DiskTier: KV blocks persisted through a StorageBackend, bounded, checked on every read.

Blocks live under ``<offload_dir>/<namespace>/``, where the namespace digests everything that
makes a block's bytes mean something: the model (config and weight files), its dtype, the KV
dtype, block size and layout (:func:`kv_namespace`). Keys are the blocks' chained hashes, so a
restarted server finds the prefixes an earlier run stored. Each record carries a checksum
(:mod:`atlas_core.storage.kv_record`); a record that fails it is counted, deleted and treated
as a miss. The backend's coroutines run on an event loop of their own thread, so the engine
thread only submits and polls; checksums are computed and verified on a small thread pool
(``zlib.crc32`` releases the GIL), so neither the loop nor the engine waits on them and many
records are checked at once. A read lands in the buffer the caller gives (the host tier's
page-locked row, :meth:`DiskTier.fetch`) through the backend's
:meth:`~atlas_core.interfaces.StorageBackend.read_into` and is verified there, in place: the
block crosses host memory once on its way to the device. A write of a row the device is still
copying into waits for that copy's event (on a checksum thread) before it seals the record.
Finished reads and writes are queued as they complete, so a poll costs what finished, not what
is in flight. The achieved read rate (:attr:`DiskTier.read_rate`)
is measured over bursts of reads: from the first read submitted while none was in flight to the
last of them completed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import hashlib
import json
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

import numpy as np

from atlas_core.engine.kv_block_io import byte_view
from atlas_core.engine.kv_host_arena import aligned_empty, padded
from atlas_core.engine.kv_restore import DISK_DECAY, RateEstimate
from atlas_core.storage.kv_record import (HEADER_SIZE, VERSION, CorruptRecord, new_record,
                                          seal_record, unpack_record)

log = logging.getLogger(__name__)

_FINGERPRINT_BYTES = 1 << 20
#: Failed writes in a row after which the tier stops writing (reads go on).
MAX_WRITE_FAILURES = 8
#: Threads computing and verifying checksums.
CHECKSUM_THREADS = min(8, os.cpu_count() or 1)
#: Bytes of finished write buffers kept for reuse (a fresh buffer faults in every page).
SPARE_BYTES = 256 << 20


def _seal(record: np.ndarray, block_hash: bytes, ready: Any) -> None:
    # On a checksum thread: wait for the device copy into ``record`` (if any), then seal it.
    if ready is not None:
        ready.wait()
    seal_record(record, block_hash)


def _model_fingerprint(model: Any, model_name: str | None) -> str:
    path = getattr(model, "path", None)
    h = hashlib.sha256(f"{type(model).__name__}:{getattr(model, 'dtype', '')}".encode())
    if path is None or not (Path(path) / "config.json").is_file():
        h.update(str(model_name).encode())
        return h.hexdigest()
    path = Path(path)
    h.update((path / "config.json").read_bytes())
    for weights in sorted(path.glob("*.safetensors")):
        size = weights.stat().st_size
        h.update(f"{weights.name}:{size}".encode())
        with open(weights, "rb") as f:
            h.update(f.read(_FINGERPRINT_BYTES))
            f.seek(max(0, size - _FINGERPRINT_BYTES))
            h.update(f.read(_FINGERPRINT_BYTES))
    return h.hexdigest()


def kv_namespace(model: Any, model_name: str | None, kv_dtype: Any, block_size: int,
                 pool_shapes: list[tuple], extra: dict | None = None) -> tuple[str, dict]:
    """``(directory name, identity)`` of the blocks this engine writes and may read back.

    The weights are fingerprinted by their size and first and last MiB (a fine-tune of the same
    shapes differs there), so two models never share blocks. ``extra`` joins the identity (a
    sliding-window pool's window and layout: its main-pool records then hold only the
    full-attention layers, so they must never be read as records of every layer).
    """
    identity = {"model": _model_fingerprint(model, model_name), "name": str(model_name),
                "kv_dtype": str(kv_dtype), "block_size": block_size,
                "layout": [list(s) for s in pool_shapes], "format": VERSION, **(extra or {})}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return f"kv-{digest[:24]}", identity


class StorageLoop:
    """An asyncio event loop on a daemon thread that runs a StorageBackend's coroutines."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="atlas-kv-storage",
                                       daemon=True)
        self.thread.start()

    def submit(self, coro) -> concurrent.futures.Future:
        """Schedule ``coro`` on the loop; its future completes on that thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


class DiskTier:
    """Bounded (least recently used first out) persistent tier over ``storage``.

    Args:
        storage: a StorageBackend rooted in this engine's namespace directory.
        payload_size: bytes of one block.
        capacity_bytes: most bytes of records kept.
    """

    def __init__(self, storage: Any, payload_size: int, capacity_bytes: int) -> None:
        self.storage = storage
        self.payload_size = payload_size
        self.record_size = HEADER_SIZE + payload_size
        self.capacity = max(0, capacity_bytes // self.record_size)
        self.runner = StorageLoop()
        self.checksums = concurrent.futures.ThreadPoolExecutor(CHECKSUM_THREADS,
                                                               "atlas-kv-checksum")
        self.index: OrderedDict[bytes, None] = OrderedDict()
        try:
            stored = storage.keys()
        except NotImplementedError:
            log.warning("KV disk tier: %s cannot list its keys; blocks of earlier runs are not "
                        "found", type(storage).__name__)
            stored = []
        for key in stored:
            if len(key) == 32 and all(c in "0123456789abcdef" for c in key):
                self.index[bytes.fromhex(key)] = None
        #: hash -> (future, record, whether the record is ours to reuse once written, event
        #: after which the record holds its payload or None)
        self.writes: dict[bytes, tuple[concurrent.futures.Future, np.ndarray, bool, Any]] = {}
        self.reads: dict[bytes, concurrent.futures.Future] = {}
        self._finished: deque = deque()
        self._read_finished = threading.Event()
        self._spare: list[np.ndarray] = []
        self.num_loaded_at_start = len(self.index)
        self.num_corrupt = storage.num_torn_writes
        self.num_write_failures = 0
        self.num_read_failures = 0
        self.bytes_read = self.bytes_written = 0
        #: seconds the checksum threads spent verifying reads (summed over threads)
        self.verify_seconds = 0.0
        self._verify_lock = threading.Lock()
        #: bytes/s of completed reads while reads were in flight
        self.read_rate = RateEstimate(DISK_DECAY)
        self._burst: list[float] = []  # [start, last completion, bytes read] of reads in flight
        self.is_writable = True
        self.is_closed = False
        self._failures_in_a_row = 0
        self._trim()

    @property
    def used_bytes(self) -> int:
        return len(self.index) * self.record_size

    @property
    def can_write(self) -> bool:
        """Whether :meth:`write` stores anything (writable and not sized zero)."""
        return self.is_writable and self.capacity > 0

    def contains(self, h: bytes) -> bool:
        return h in self.index or h in self.writes

    def new_record(self) -> np.ndarray:
        """A record buffer to fill (``record[HEADER_SIZE:]``) and pass to :meth:`write_record`."""
        return self._spare.pop() if self._spare else new_record(self.payload_size)

    def write(self, h: bytes, payload: Any) -> None:
        """Store a block in the background (no-op when present; refreshes its LRU place);
        ``payload`` is copied, the caller may reuse it."""
        if self._skip_write(h):
            return
        record = self.new_record()
        record[HEADER_SIZE:] = byte_view(payload)
        self.write_record(h, record, recycle=True)

    def write_record(self, h: bytes, record: np.ndarray, recycle: bool = False,
                     ready: Any = None) -> None:
        """Store the block whose bytes fill ``record``'s payload, without copying it: the
        caller leaves ``record`` unchanged while ``h`` is in :attr:`writes`. The header is
        sealed on the checksum threads. ``recycle``: the record came from :meth:`new_record`
        and may be reused once written. ``ready``: a
        :class:`~atlas_core.interfaces.DeviceEvent` after which the payload is in ``record``
        (a device copy still in flight), waited for before anything reads it."""
        if self._skip_write(h):
            if recycle:
                self._keep_spare(record)
            return
        future = self.runner.submit(self._write(h, record, ready))
        self.writes[h] = (future, record, recycle, ready)
        future.add_done_callback(functools.partial(self._finish, "write", h))

    def _skip_write(self, h: bytes) -> bool:
        if h in self.index:
            self.index.move_to_end(h)
            return True
        return h in self.writes or not self.can_write

    async def _write(self, h: bytes, record: np.ndarray, ready: Any) -> None:
        await asyncio.get_running_loop().run_in_executor(self.checksums, _seal, record, h, ready)
        await self.storage.write(h.hex(), memoryview(record))

    def fetch(self, h: bytes, into: np.ndarray | None = None) -> Any | None:
        """The block's payload if it is at hand now (a write still in flight), else start
        reading it (see :meth:`poll`) and return ``None``.

        ``into``: the ``uint8`` buffer the record is read into and verified in (at least
        :attr:`record_size` bytes; page-aligned and spanning whole pages for a read with no
        copy, see :class:`~atlas_core.engine.kv_host_arena.HostArena`); the caller leaves it
        alone while ``h`` is in :attr:`reads`. Default: a fresh aligned buffer. Unused when
        nothing is read (check :attr:`reads`)."""
        pending = self.writes.get(h)
        if pending is not None:
            future, record, _, ready = pending
            if ready is not None:
                ready.wait()
            self.writes[h] = (future, record, False, None)  # handed out: never reused
            return record[HEADER_SIZE:]
        if h not in self.reads and h in self.index:
            self.index.move_to_end(h)
            if not self.reads:
                now = time.perf_counter()
                self._burst = [now, now, 0]
            if into is None:
                into = aligned_empty(padded(self.record_size))
            elif into.nbytes < self.record_size:
                raise ValueError(f"fetch: a buffer of {into.nbytes} bytes for records of "
                                 f"{self.record_size}")
            future = self.runner.submit(self._read(h, into))
            self.reads[h] = future
            future.add_done_callback(functools.partial(self._finish, "read", h))
        return None

    async def _read(self, h: bytes, buf: np.ndarray) -> np.ndarray:
        key, view = h.hex(), memoryview(buf).cast("B")
        read_into = getattr(self.storage, "read_into", None)
        try:
            if read_into is not None:
                n = await read_into(key, view)
            else:  # a backend outside the StorageBackend ABC: read, then copy in
                data = memoryview(await self.storage.read(key)).cast("B")
                n = data.nbytes
                if n > view.nbytes:
                    raise BufferError(f"{n} bytes for a buffer of {view.nbytes}")
                view[:n] = data
        except BufferError:
            raise CorruptRecord(f"record is longer than {view.nbytes} bytes (torn or foreign "
                                "file)") from None
        return await asyncio.get_running_loop().run_in_executor(self.checksums, self._verify,
                                                                h, buf, n)

    def _verify(self, h: bytes, buf: np.ndarray, n: int) -> np.ndarray:
        # On a checksum thread: the payload of the record in ``buf[:n]``, checked in place.
        start = time.perf_counter()
        try:
            unpack_record(h, buf[:n], self.payload_size)
        finally:
            with self._verify_lock:
                self.verify_seconds += time.perf_counter() - start
        return buf[HEADER_SIZE:self.record_size]

    def _finish(self, kind: str, h: bytes, future: concurrent.futures.Future) -> None:
        # Runs on whichever thread completed the future.
        self._finished.append((kind, h, future))
        if kind == "read":
            burst = self._burst
            if burst:
                burst[1] = time.perf_counter()
            self._read_finished.set()

    def poll(self) -> dict[bytes, Any]:
        """Reap finished writes and reads; returns the payloads read ``{hash: payload}``."""
        self._read_finished.clear()
        done = {}
        while self._finished:
            kind, h, future = self._finished.popleft()
            if kind == "write":
                pending = self.writes.get(h)
                if pending is not None and pending[0] is future:
                    del self.writes[h]
                    self._finish_write(h, future)
                    if pending[2]:
                        self._keep_spare(pending[1])
                continue
            if self.reads.get(h) is not future:
                continue
            del self.reads[h]
            try:
                done[h] = future.result()
                self.bytes_read += self.record_size
                self._burst[2] += self.record_size
            except CorruptRecord as exc:
                self.num_corrupt += 1
                log.warning("KV disk tier: block %s is corrupt (%s); deleted, it will be "
                            "recomputed", h.hex(), exc)
                self._forget(h)
            except Exception as exc:  # noqa: BLE001 - a failed read is a miss, never a crash
                self.num_read_failures += 1
                log.warning("KV disk tier: reading block %s failed (%s: %s); it will be "
                            "recomputed", h.hex(), type(exc).__name__, exc)
                self.index.pop(h, None)
        if self._burst and not self.reads:
            start, end, nbytes = self._burst
            self.read_rate.observe(nbytes, end - start)
            self._burst = []
        return done

    def _keep_spare(self, record: np.ndarray) -> None:
        if (len(self._spare) + 1) * self.record_size <= SPARE_BYTES:
            self._spare.append(record)

    def _finish_write(self, h: bytes, future: concurrent.futures.Future) -> None:
        exc = future.exception()
        if exc is None:
            self.index[h] = None
            self.bytes_written += self.record_size
            self._failures_in_a_row = 0
            self._trim()
            return
        self.num_write_failures += 1
        self._failures_in_a_row += 1
        log.warning("KV disk tier: writing a block failed (%s: %s); counted, the server goes on",
                    type(exc).__name__, exc)
        if self._failures_in_a_row >= MAX_WRITE_FAILURES and self.is_writable:
            self.is_writable = False
            log.error("KV disk tier: %d writes failed in a row; no more blocks are written this "
                      "run (reads go on). Free space in the offload directory or fix its "
                      "permissions, then restart", self._failures_in_a_row)

    def wait(self, timeout: float) -> None:
        """Block until some read finishes (or ``timeout`` seconds pass); returns at once when
        one finished since the last :meth:`poll`."""
        if self.reads:
            self._read_finished.wait(timeout)

    def flush(self, timeout: float = 60.0) -> None:
        """Wait for the writes in flight (within ``timeout`` s) and reap them."""
        concurrent.futures.wait([w[0] for w in self.writes.values()], timeout)
        self.poll()

    def _forget(self, h: bytes) -> None:
        self.index.pop(h, None)
        self.runner.submit(self.storage.delete(h.hex()))

    def _trim(self) -> None:
        while len(self.index) > self.capacity:
            h, _ = self.index.popitem(last=False)
            self.runner.submit(self.storage.delete(h.hex()))

    def close(self, timeout: float = 60.0) -> None:
        """Finish the writes in flight (within ``timeout`` s), then stop the loop (once)."""
        if self.is_closed:
            return
        self.is_closed = True
        pending = [w[0] for w in self.writes.values()] + list(self.reads.values())
        concurrent.futures.wait(pending, timeout)
        self.poll()
        self.runner.submit(asyncio.sleep(0)).result(timeout)
        self.runner.close()
        self.checksums.shutdown(wait=False, cancel_futures=True)
        self.storage.close()
