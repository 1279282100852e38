"""KVTiers: where prefix-cache blocks go when the GPU pool evicts them, and how they come back.

Tiers, fastest first: the device pool (the :class:`~atlas_core.engine.block_manager.BlockManager`
prefix cache), host memory (``--kv-host-gb``, least recently used out) and disk
(``--kv-offload-dir``, :class:`~atlas_core.engine.kv_disk.DiskTier`). A block evicted from the
device is copied to host memory and written through to disk, so disk holds every block that
left the device and survives restarts. When a waiting sequence's prefix continues past the
device-cached blocks into lower tiers, the scheduler first calls :meth:`KVTiers.prefetch`,
which starts disk reads on the storage thread; the sequence is admitted once every block is in
host memory (other sequences run meanwhile), and the host -> device copies go in before the
step's forward.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import uuid
from collections import OrderedDict
from dataclasses import field, fields, make_dataclass
from pathlib import Path
from typing import Any

from atlas_core.engine.kv_block_io import KVBlockIO
from atlas_core.engine.kv_disk import DiskTier, kv_namespace
from atlas_core.engine.outputs import EngineStats

log = logging.getLogger(__name__)

_GIB = 1 << 30
#: Seconds the scheduler waits for a disk read when nothing else can run.
READ_WAIT_S = 0.05


@functools.cache
def _tiered_stats_class(base: type) -> type:
    # A subclass with a ``kv_tiers`` field, so ``dataclasses.replace`` keeps it, whatever
    # EngineStats subclass the engine already hands out.
    return make_dataclass(f"Tiered{base.__name__}",
                          [("kv_tiers", dict, field(default_factory=dict))], bases=(base,))


def with_tier_stats(stats: EngineStats, tiers: "KVTiers | None") -> EngineStats:
    """``stats`` with a ``kv_tiers`` field holding ``tiers.stats()`` (unchanged without tiers)."""
    if tiers is None:
        return stats
    values = {f.name: getattr(stats, f.name) for f in fields(stats) if f.init}
    return _tiered_stats_class(type(stats))(**values, kv_tiers=tiers.stats())


def close_kv_tiers(engine: Any) -> None:
    """Write ``engine``'s device-cached prefix blocks to its tiers (the disk tier keeps them
    for the next run), finish the writes in flight and stop the storage thread."""
    tiers = getattr(engine, "kv_tiers", None)
    if tiers is not None:
        engine.block_manager.flush_to_tiers()
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

    def spill(self, evicted: list[tuple[int, bytes]]) -> None:
        """Copy blocks the device pool is about to reuse into the lower tiers."""
        new = [(b, h) for b, h in evicted if h not in self.host]
        for _, h in evicted:
            if h in self.host:
                self.host.move_to_end(h)
        if self.disk is not None:
            new = [(b, h) for b, h in new if self.host_capacity or h not in self.disk.index]
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

    def prefetch(self, hashes: list[bytes]) -> bool:
        """Start reading the lower-tier blocks of ``hashes`` (a prefix past the device cache);
        True when every block that any tier holds is in memory now."""
        self.poll()
        ready = True
        for h in hashes:
            if h in self.host or h in self.staged:
                continue
            if self.disk is None or not self.disk.contains(h):
                break
            payload = self.disk.fetch(h)
            if payload is None:
                ready = False
            else:
                self.staged[h] = payload
        return ready

    def take(self, hashes: list[bytes]) -> list[Any]:
        """Payloads of the leading ``hashes`` held in memory (stops at the first absent one);
        counts each block as a host or disk hit and the first absent one as a miss."""
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
                self.counts["disk" if self.disk is not None else "host"]["misses"] += 1
                break
            self.counts[tier]["hits"] += 1
            self.counts[tier]["bytes_read"] += self.io.block_bytes
        while len(self.host) > self.host_capacity:
            self.host.popitem(last=False)
        return out

    def wait_reads(self) -> bool:
        """Wait briefly for a disk read when some are in flight; True if there were any."""
        if self.disk is None or not self.disk.reads:
            return False
        self.disk.wait(READ_WAIT_S)
        self.poll()
        return True

    def stats(self) -> dict:
        """``tier -> counter -> value``: hits, misses, bytes read/written, bytes held."""
        out = {tier: dict(c) for tier, c in self.counts.items()}
        out["host"]["used_bytes"] = len(self.host) * self.io.block_bytes
        out["host"]["capacity_bytes"] = self.host_capacity * self.io.block_bytes
        if self.disk is not None:
            d = self.disk
            out["disk"].update(used_bytes=d.used_bytes, capacity_bytes=d.capacity * d.record_size,
                               bytes_written=d.bytes_written, corrupt=d.num_corrupt,
                               write_failures=d.num_write_failures,
                               read_failures=d.num_read_failures)
        return out

    def describe(self) -> str:
        """One line: sizes and hit rates of each tier."""
        s = self.stats()
        parts = []
        for tier in ("host", "disk"):
            if tier == "disk" and self.disk is None:
                continue
            c = s[tier]
            looked = c["hits"] + c["misses"]
            rate = f"{c['hits'] / looked:.0%}" if looked else "n/a"
            parts.append(f"{tier} {c['used_bytes'] / _GIB:.2f}/{c['capacity_bytes'] / _GIB:.2f} "
                         f"GiB, hit rate {rate} ({c['hits']} blocks)")
        if self.disk is not None:
            parts.append(f"{self.disk.num_corrupt} corrupt")
        return "KV tiers: " + "; ".join(parts)

    def close(self) -> None:
        """Finish the disk writes in flight and stop the storage thread."""
        if self.disk is not None:
            self.disk.close()


def check_offload_dir(path: str) -> Path:
    """Create ``path`` and check a file can be written there.

    Raises:
        ValueError: it cannot be created or written (the message says how to fix it).
    """
    root = Path(path).expanduser()
    probe = root / f".atlas-write-test-{uuid.uuid4().hex}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"atlas")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--kv-offload-dir {path} is not writable ({exc.strerror or exc}); "
                         "pick a directory this user can write, or leave the flag out") from None
    return root


def create_storage(name: str, root: Path) -> Any:
    """The StorageBackend ``name`` (``auto``: io_uring when installed, else posix) at ``root``."""
    from atlas_core.plugins import Registry
    registry = Registry()
    names = registry.names("storage_backends")
    if name == "auto":
        name = "io_uring" if "io_uring" in names else "posix"
    if name not in names:
        raise ValueError(f"--kv-storage {name}: no such storage backend; installed: "
                         f"{', '.join(names)}")
    return registry.create("storage_backends", name, root=str(root))


def create_kv_tiers(args: Any, model: Any, runner: Any, block_manager: Any) -> KVTiers | None:
    """The tiers ``args`` ask for below ``runner``'s KV pools, set as ``block_manager.tiers``
    (``None`` when neither host memory nor disk is asked for)."""
    backend, kv_caches, kv_config = runner.backend, runner.kv_caches, runner.kv
    host_bytes = int(float(args.kv_host_gb or 0) * _GIB)
    if not args.enable_prefix_caching or (not host_bytes and not args.kv_offload_dir):
        return None
    io = KVBlockIO(backend, kv_caches)
    if not io.pools:
        log.info("KV tiers: the model has no paged KV cache; tiers are off")
        return None
    disk = None
    if args.kv_offload_dir:
        root = check_offload_dir(args.kv_offload_dir)
        name, identity = kv_namespace(model, args.model, kv_config.dtype, kv_config.block_size,
                                      [tuple(p.shape[1:]) for p in io.pools])
        storage = create_storage(getattr(args, "kv_storage", "auto"), root / name)
        (root / f"{name}.json").write_text(json.dumps(identity, indent=1) + "\n")
        disk = DiskTier(storage, io.block_bytes, _disk_capacity(args, root, storage))
    max_staged = 4 * -(-kv_config.max_seq_len // kv_config.block_size)
    tiers = block_manager.tiers = KVTiers(io, host_bytes, disk, max_staged)
    log.info("%s (%s blocks of %.2f MiB found on disk)", tiers.describe(),
             disk.num_loaded_at_start if disk else 0, io.block_bytes / (1 << 20))
    return tiers


def _disk_capacity(args: Any, root: Path, storage: Any) -> int:
    want = int(float(args.kv_offload_gb) * _GIB)
    free = shutil.disk_usage(root).free + storage.used_bytes()
    if free < (64 << 20):
        raise ValueError(f"--kv-offload-dir {root} is full ({free / (1 << 20):.0f} MiB free); "
                         "free space there, pick another directory or leave the flag out")
    if want > free:
        log.warning("--kv-offload-gb %.1f is more than the %.1f GiB free in %s; using %.1f GiB",
                    want / _GIB, free / _GIB, root, 0.9 * free / _GIB)
        want = int(0.9 * free)
    return want
