"""KVTiers: where prefix-cache blocks go when the GPU pool evicts them, and how they come back.

Tiers, fastest first: the device pool (the :class:`~atlas_core.engine.block_manager.BlockManager`
prefix cache), host memory (``--kv-host-gb``, least recently used out) and disk
(``--kv-offload-dir``, :class:`~atlas_core.engine.kv_disk.DiskTier`). A block evicted from the
device is copied to host memory and written through to disk, so disk holds every block that
left the device and survives restarts. When a waiting sequence's prefix continues past the
device-cached blocks into lower tiers, the scheduler first calls :meth:`KVTiers.prefetch`,
which starts disk reads on the storage thread; the sequence is admitted once every block is in
host memory (other sequences run meanwhile), and the host -> device copies go in before the
step's forward. Whether a prompt's disk-only blocks are read at all or recomputed is
:attr:`KVTiers.restore`'s choice (:mod:`atlas_core.engine.kv_restore`, ``--kv-disk-restore``):
reading from a slow disk can take longer than prefilling again. Hybrid models' recurrent-state snapshots (:class:`~atlas_core.engine.state_cache.
StateCache`) get tiers of their own (:attr:`KVTiers.state`, keyed by the same block hashes),
since a cached prefix is only usable up to a boundary whose snapshot is at hand too. Likewise
the sliding-window layers' own block pool (:mod:`atlas_core.engine.window_blocks`) gets tiers of
its own (:attr:`KVTiers.window`): one record per pool and block, each restored where it exists.

Host memory is a :class:`~atlas_core.engine.kv_host_arena.HostArena` of record-shaped rows: a
spilled block is copied from the device into its row once and written to disk from that row; a
block read from disk is read into a row (verified there) and copied to the device from it. A row
is not reused while its disk write or disk read is in flight or while a payload handed out by
:meth:`KVTiers.take` is being restored from it.

Spills and restores do not synchronize the device: each queues its copies and keeps the
:class:`~atlas_core.interfaces.DeviceEvent` recorded after them for the rows it touched. The
device side needs no wait (the pools and the next step share one queue); the host waits on a
row's event before anything but the device writes into the row (a disk read, a copy of a
staged payload) and the disk tier before it checksums a spilled row.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from atlas_core.engine.kv_block_io import KVBlockIO, byte_view
from atlas_core.engine.kv_disk import DiskTier
from atlas_core.engine.kv_host_arena import HostArena
from atlas_core.engine.kv_restore import DiskRestorePolicy
from atlas_core.storage.kv_record import HEADER_SIZE

_GIB = 1 << 30
#: Seconds the scheduler waits for a disk read when nothing else can run.
READ_WAIT_S = 0.05


def close_kv_tiers(engine: Any) -> None:
    """Write ``engine``'s device-cached prefix blocks to its tiers (the disk tier keeps them
    for the next run), finish the writes in flight and stop the storage thread."""
    tiers = getattr(engine, "kv_tiers", None)
    if tiers is not None:
        engine.block_manager.flush_to_tiers()
        if engine.state_cache is not None:
            engine.state_cache.flush_to_tiers()
        tiers.close()


class KVTiers:
    """Host-memory and disk tiers below the device prefix cache.

    Args:
        io: copies blocks between the device pools and host bytes.
        host_bytes: host-memory tier size (0: none).
        disk: the disk tier, or ``None``.
        max_staged: blocks read from disk kept for sequences not admitted yet.
    """

    def __init__(self, io: KVBlockIO, host_bytes: int, disk: DiskTier | None,
                 max_staged: int = 4096) -> None:
        self.io, self.disk = io, disk
        self.host_capacity = host_bytes // io.block_bytes if io.block_bytes else 0
        self.arena = HostArena(io.backend, HEADER_SIZE + io.block_bytes, self.host_capacity)
        #: block hash -> arena row, least recently used first
        self.host: OrderedDict[bytes, int] = OrderedDict()
        #: arena rows of the payloads the last :meth:`take` handed out
        self.lent: set[int] = set()
        self.staged: OrderedDict[bytes, Any] = OrderedDict()
        self.max_staged = max_staged
        self.counts = {tier: {"hits": 0, "misses": 0, "bytes_read": 0, "bytes_written": 0}
                       for tier in ("host", "disk")}
        self.counts["disk"]["skipped_blocks"] = 0
        self.state: KVTiers | None = None
        #: tiers of the sliding-window block pool (same keys), or ``None``
        self.window: KVTiers | None = None
        #: read-or-recompute choice for disk-only blocks (``None``: always read)
        self.restore: DiskRestorePolicy | None = None
        #: disk reads started for a prompt that waits for them (probes are not)
        self.reading: set[bytes] = set()
        #: arena rows that disk reads in flight land in, and the staged blocks held in rows
        self.read_rows: dict[bytes, int] = {}
        self.staged_rows: dict[bytes, int] = {}
        #: the event after the last device copy into or out of each row (until waited on)
        self.row_events: dict[int, Any] = {}
        #: ``(event, payloads)`` of restores whose copies may still read the payloads
        self._restoring: list[tuple[Any, list]] = []

    def _rows(self, n: int, keep: frozenset | set = frozenset()) -> list[int]:
        # Up to ``n`` arena rows for new host entries: free ones, then those of the least
        # recently used entries not lent out, not being written to disk and not in ``keep``
        # (evicted here).
        rows = []
        while len(rows) < n:
            row = self.arena.take()
            if row is None:
                break
            rows.append(row)
        if len(rows) < n:
            writing = self.disk.writes if self.disk is not None else {}
            victims = []
            for h, row in self.host.items():
                if len(rows) + len(victims) >= n:
                    break
                if row not in self.lent and h not in writing and h not in keep:
                    victims.append(h)
            rows += [self.host.pop(h) for h in victims]
        return rows

    def _payload(self, row: int) -> Any:
        return self.arena.row(row)[HEADER_SIZE:]

    def _settle(self, row: int) -> None:
        # Before the host (or a disk read) writes into ``row``: wait for the device copies
        # queued into or out of it (at once when they finished, as they mostly have).
        event = self.row_events.pop(row, None)
        if event is not None:
            event.wait()

    def _fetch(self, h: bytes, keep: set) -> Any | None:
        # ``disk.fetch`` into an arena row (one of the least recently used entries' not in
        # ``keep`` when the arena is full; a buffer of the disk tier's when every row is busy).
        disk = self.disk
        if h in disk.reads:
            return None
        row = None
        if self.host_capacity and h in disk.index and h not in disk.writes:
            rows = self._rows(1, keep)
            if rows:
                row = rows[0]
                self._settle(row)
        payload = disk.fetch(h, None if row is None else self.arena.record_buffer(row))
        if row is not None:
            if h in disk.reads:
                self.read_rows[h] = row
            else:
                self.arena.give(row)
        return payload

    def _unstage(self, h: bytes) -> Any:
        # Drop staged block ``h`` (its row back to the arena); returns its payload.
        row = self.staged_rows.pop(h, None)
        if row is not None:
            self.arena.give(row)
        return self.staged.pop(h)

    def spill(self, evicted: list[tuple[int, bytes]]) -> None:
        """Copy blocks the device pool is about to reuse into the lower tiers: the most recent
        into host memory (as many as it has rows for), every one to disk."""
        disk, todo = self.disk, []
        for b, h in evicted:
            if h in self.host:
                self.host.move_to_end(h)
            else:
                todo.append((b, h))
        rows = self._rows(len(todo)) if self.host_capacity and todo else []
        num_disk_only = len(todo) - len(rows)
        blocks, dests, writes = [], [], []
        for b, h in todo[:num_disk_only]:
            if disk is not None and disk.can_write and not disk.contains(h):
                record = disk.new_record()
                blocks.append(b)
                dests.append(record[HEADER_SIZE:])
                writes.append((h, record, True))
        for (b, h), row in zip(todo[num_disk_only:], rows):
            self.host[h] = row
            self.counts["host"]["bytes_written"] += self.io.block_bytes
            blocks.append(b)
            dests.append(self._payload(row))
            if disk is not None:
                writes.append((h, self.arena.row(row), False))
        event = self.io.read_into_async(blocks, dests)
        for _, row in zip(todo[num_disk_only:], rows):
            self.row_events[row] = event
        for h, record, recycle in writes:
            disk.write_record(h, record, recycle, ready=event)

    def poll(self) -> None:
        """Move finished disk reads into the staging area (and reap finished writes)."""
        if self.disk is None:
            return
        for h, payload in self.disk.poll().items():
            if h in self.staged:
                self._unstage(h)
            row = self.read_rows.pop(h, None)
            if row is not None:
                self.staged_rows[h] = row
            self.staged[h] = payload
        for h in [h for h in self.read_rows if h not in self.disk.reads]:
            self.arena.give(self.read_rows.pop(h))  # corrupt or failed: nothing staged
        self.reading.intersection_update(self.disk.reads)
        while len(self.staged) > self.max_staged:
            self._unstage(next(iter(self.staged)))

    def prefetch(self, hashes: list[bytes]) -> int | None:
        """Start reading the lower-tier blocks of ``hashes`` (a prefix past the device cache);
        ``None`` while some are being read, else how many leading ones are in memory now."""
        self.poll()
        disk, todo, count, keep = self.disk, [], 0, set()
        for h in hashes:
            if h in self.host:  # used now: its row is no victim of this prompt's reads
                self.host.move_to_end(h)
                keep.add(h)
            elif h not in self.staged:
                if disk is None or not disk.contains(h):
                    break
                todo.append(h)
            count += 1
        if todo and not self._should_read(todo):
            first = hashes.index(todo[0])
            self.counts["disk"]["skipped_blocks"] += count - first
            for h in todo[:self.restore.probe_blocks]:
                self._fetch(h, keep)
            return first
        ready = True
        for h in todo:
            payload = self._fetch(h, keep)
            if payload is None:
                ready = False
                self.reading.add(h)
            else:
                self.staged[h] = payload
        return count if ready else None

    def _should_read(self, todo: list[bytes]) -> bool:
        # Disk-only blocks of one prompt: read them, or recompute them (False)?
        if self.restore is None or not self.reading.isdisjoint(todo):
            return True
        num_reads = sum(h not in self.disk.writes for h in todo)
        return not num_reads or self.restore.should_read(num_reads, self.disk.record_size,
                                                         self.disk.read_rate.rate)

    def on_step(self, sched: Any, seconds: float) -> None:
        """Time an executed engine step (feeds :attr:`restore`'s prefill rate)."""
        if self.restore is not None:
            self.restore.on_step(sched, seconds)

    def num_in_memory(self, hashes: list[bytes]) -> int:
        """How many leading ``hashes`` are in host memory (or staged from disk) now."""
        for i, h in enumerate(hashes):
            if h not in self.host and h not in self.staged:
                return i
        return len(hashes)

    def holds(self, h: bytes) -> bool:
        """Whether block ``h`` is in host memory, staged from disk or on disk."""
        return (h in self.host or h in self.staged
                or (self.disk is not None and self.disk.contains(h)))

    def _other_pools(self) -> list[tuple[str, "KVTiers"]]:
        # The tiers of the other pools keyed by the same hashes, with their stats prefix.
        return [(name, t) for name, t in (("state", self.state), ("window", self.window))
                if t is not None]

    def count_miss(self, h: bytes) -> None:
        """A prefix went past the device cache and host memory lacks its next block ``h``: a
        miss unless the disk has it (then it is recomputed by choice: ``skipped_blocks``)."""
        if self.disk is None or not self.disk.contains(h):
            self.counts["disk" if self.disk is not None else "host"]["misses"] += 1

    def take(self, hashes: list[bytes]) -> list[Any]:
        """Payloads of the leading ``hashes`` held in memory (stops at the first absent one);
        counts each as a host or disk hit. Blocks read from disk join the host tier. Copy the
        payloads into the device with :meth:`write` (they stay valid until then, or until the
        next call)."""
        self.lent.clear()
        out, from_disk = [], []
        for h in hashes:
            row = self.host.get(h)
            if row is not None:
                self.host.move_to_end(h)
                self.lent.add(row)
                out.append(self._payload(row))
                tier = "host"
            elif h in self.staged:
                payload, row = self.staged.pop(h), self.staged_rows.pop(h, None)
                if row is not None:  # read into its row: joins the host tier as it is
                    self.host[h] = row
                    self.lent.add(row)
                    payload = self._payload(row)
                else:
                    from_disk.append((len(out), h))
                out.append(payload)
                tier = "disk"
            else:
                break
            self.counts[tier]["hits"] += 1
            self.counts[tier]["bytes_read"] += self.io.block_bytes
        rows = self._rows(len(from_disk)) if self.host_capacity and from_disk else []
        for (i, h), row in zip(from_disk, rows):
            self._settle(row)
            payload = self._payload(row)
            payload[:] = byte_view(out[i])
            self.host[h] = row
            self.lent.add(row)
            out[i] = payload
        return out

    def write(self, blocks: list[int], payloads: list[Any]) -> Any:
        """Copy ``payloads`` (from :meth:`take`) into device ``blocks``; their host rows may be
        reused afterwards (the host waits for the copies first, the device need not: work
        queued from now on sees the blocks restored). Returns the
        :class:`~atlas_core.interfaces.DeviceEvent` after the copies."""
        event = self.io.write_async(blocks, payloads)
        for row in self.lent:
            self.row_events[row] = event
        self.lent.clear()
        self._restoring = [(e, p) for e, p in self._restoring if not e.query()]
        if not event.query():
            self._restoring.append((event, payloads))  # alive until the device read them
        return event

    def clear_memory(self) -> None:
        """Forget every block held in host memory or staged from disk, the other pools' tiers'
        too (disk writes in flight finish first: they read host rows)."""
        if self.disk is not None:
            self.disk.flush()
        for row in [*self.host.values(), *self.staged_rows.values()]:
            self.arena.give(row)
        self.host.clear()
        self.staged.clear()
        self.staged_rows.clear()
        self.lent.clear()
        self.reading.clear()
        for _, t in self._other_pools():
            t.clear_memory()

    def wait_reads(self) -> bool:
        """Wait briefly for a disk read when some are in flight (the state snapshots' and
        window pool's tiers included); True if there were any."""
        if self.disk is None or not self.disk.reads:
            return any(t.wait_reads() for _, t in self._other_pools())
        self.disk.wait(READ_WAIT_S)
        self.poll()
        return True

    def stats(self) -> dict:
        """``tier -> counter -> value``: hits, misses, bytes read/written, bytes held (the state
        snapshots' tiers as ``state_host`` / ``state_disk``, the window pool's as ``window_host`` /
        ``window_disk``)."""
        out = {tier: dict(c) for tier, c in self.counts.items()}
        out["host"]["used_bytes"] = len(self.host) * self.io.block_bytes
        out["host"]["capacity_bytes"] = self.host_capacity * self.io.block_bytes
        if self.disk is not None:
            d = self.disk
            out["disk"].update(used_bytes=d.used_bytes, capacity_bytes=d.capacity * d.record_size,
                               bytes_written=d.bytes_written, corrupt=d.num_corrupt,
                               write_failures=d.num_write_failures,
                               read_failures=d.num_read_failures)
            if d.read_rate.rate is not None:
                out["disk"]["read_bytes_per_s"] = d.read_rate.rate
        if self.disk is None:
            del out["disk"]
        for name, t in self._other_pools():
            out.update({f"{name}_{tier}": c for tier, c in t.stats().items()})
        return out

    def describe(self) -> str:
        """One line: sizes and hit rates of each tier."""
        s = self.stats()
        parts = []
        for tier in ("host", "disk", "state_host", "state_disk", "window_host", "window_disk"):
            if tier not in s:
                continue
            c = s[tier]
            looked = c["hits"] + c["misses"]
            rate = f"{c['hits'] / looked:.0%}" if looked else "n/a"
            parts.append(f"{tier.replace('_', ' ')} {c['used_bytes'] / _GIB:.2f}/"
                         f"{c['capacity_bytes'] / _GIB:.2f} GiB, hit rate {rate} ({c['hits']} "
                         "blocks)")
        corrupt = sum(c.get("corrupt", 0) for c in s.values())
        if self.disk is not None:
            parts.append(f"{corrupt} corrupt")
        return "KV tiers: " + "; ".join(parts)

    def close(self) -> None:
        """Finish the disk writes in flight and stop the storage thread."""
        if self.disk is not None:
            self.disk.close()
        for _, t in self._other_pools():
            t.close()
