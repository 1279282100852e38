"""KVTiers: where prefix-cache blocks go when the GPU pool evicts them, and how they come back.

Tiers, fastest first: the device pool (the :class:`~atlas_core.engine.block_manager.BlockManager`
prefix cache), host memory (``--kv-host-gb``, least recently used out) and disk
(``--kv-offload-dir``, :class:`~atlas_core.engine.kv_disk.DiskTier`). A block evicted from the
device is copied to host memory and written through to disk, so disk holds every block that
left the device and survives restarts. When a waiting sequence's prefix continues past the
device-cached blocks into lower tiers, the scheduler first calls :meth:`KVTiers.prefetch`,
which starts disk reads on the storage thread; the sequence is admitted once every block is in
host memory (other sequences run meanwhile), and the host -> device copies go in before the
step's forward. Hybrid models' recurrent-state snapshots (:class:`~atlas_core.engine.state_cache.
StateCache`) get tiers of their own (:attr:`KVTiers.state`, keyed by the same block hashes),
since a cached prefix is only usable up to a boundary whose snapshot is at hand too.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from atlas_core.engine.kv_block_io import KVBlockIO
from atlas_core.engine.kv_disk import DiskTier

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
        self.host: OrderedDict[bytes, Any] = OrderedDict()
        self.host_capacity = host_bytes // io.block_bytes if io.block_bytes else 0
        self.staged: OrderedDict[bytes, Any] = OrderedDict()
        self.max_staged = max_staged
        self.counts = {tier: {"hits": 0, "misses": 0, "bytes_read": 0, "bytes_written": 0}
                       for tier in ("host", "disk")}
        self.state: KVTiers | None = None

    def spill(self, evicted: list[tuple[int, bytes]]) -> None:
        """Copy blocks the device pool is about to reuse into the lower tiers."""
        new = [(b, h) for b, h in evicted if h not in self.host]
        for _, h in evicted:
            if h in self.host:
                self.host.move_to_end(h)
        if self.disk is not None:
            new = [(b, h) for b, h in new if self.host_capacity or not self.disk.contains(h)]
        if not new:
            return
        payloads = self.io.read([b for b, _ in new])
        for (_, h), payload in zip(new, payloads):
            if self.host_capacity:
                self.host[h] = payload
                self.counts["host"]["bytes_written"] += payload.nbytes
            if self.disk is not None:
                self.disk.write(h, payload)
        while len(self.host) > self.host_capacity:
            self.host.popitem(last=False)

    def poll(self) -> None:
        """Move finished disk reads into the staging area (and reap finished writes)."""
        if self.disk is None:
            return
        for h, payload in self.disk.poll().items():
            self.staged[h] = payload
        while len(self.staged) > self.max_staged:
            self.staged.popitem(last=False)

    def prefetch(self, hashes: list[bytes]) -> int | None:
        """Start reading the lower-tier blocks of ``hashes`` (a prefix past the device cache);
        ``None`` while some are being read, else how many leading ones are in memory now."""
        self.poll()
        count, ready = 0, True
        for h in hashes:
            if h not in self.host and h not in self.staged:
                if self.disk is None or not self.disk.contains(h):
                    break
                payload = self.disk.fetch(h)
                if payload is None:
                    ready = False
                else:
                    self.staged[h] = payload
            count += 1
        return count if ready else None

    def num_in_memory(self, hashes: list[bytes]) -> int:
        """How many leading ``hashes`` are in host memory (or staged from disk) now."""
        for i, h in enumerate(hashes):
            if h not in self.host and h not in self.staged:
                return i
        return len(hashes)

    def count_miss(self) -> None:
        """A prefix went past the device cache and no lower tier had its next block."""
        self.counts["disk" if self.disk is not None else "host"]["misses"] += 1

    def take(self, hashes: list[bytes]) -> list[Any]:
        """Payloads of the leading ``hashes`` held in memory (stops at the first absent one);
        counts each as a host or disk hit."""
        out = []
        for h in hashes:
            if h in self.host:
                self.host.move_to_end(h)
                out.append(self.host[h])
                tier = "host"
            elif h in self.staged:
                payload = self.staged.pop(h)
                out.append(payload)
                if self.host_capacity:
                    self.host[h] = payload
                tier = "disk"
            else:
                break
            self.counts[tier]["hits"] += 1
            self.counts[tier]["bytes_read"] += self.io.block_bytes
        while len(self.host) > self.host_capacity:
            self.host.popitem(last=False)
        return out

    def wait_reads(self) -> bool:
        """Wait briefly for a disk read when some are in flight (the state snapshots' tiers
        included); True if there were any."""
        if self.disk is None or not self.disk.reads:
            return self.state is not None and self.state.wait_reads()
        self.disk.wait(READ_WAIT_S)
        self.poll()
        return True

    def stats(self) -> dict:
        """``tier -> counter -> value``: hits, misses, bytes read/written, bytes held (the state
        snapshots' tiers as ``state_host`` / ``state_disk``)."""
        out = {tier: dict(c) for tier, c in self.counts.items()}
        out["host"]["used_bytes"] = len(self.host) * self.io.block_bytes
        out["host"]["capacity_bytes"] = self.host_capacity * self.io.block_bytes
        if self.disk is not None:
            d = self.disk
            out["disk"].update(used_bytes=d.used_bytes, capacity_bytes=d.capacity * d.record_size,
                               bytes_written=d.bytes_written, corrupt=d.num_corrupt,
                               write_failures=d.num_write_failures,
                               read_failures=d.num_read_failures)
        if self.disk is None:
            del out["disk"]
        if self.state is not None:
            out.update({f"state_{tier}": c for tier, c in self.state.stats().items()})
        return out

    def describe(self) -> str:
        """One line: sizes and hit rates of each tier."""
        s = self.stats()
        parts = []
        for tier in ("host", "disk", "state_host", "state_disk"):
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
        if self.state is not None:
            self.state.close()
