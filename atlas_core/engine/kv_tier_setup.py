"""Building the KV tiers an engine's arguments ask for, checking them at start-up, reporting them.

:func:`create_kv_tiers` sizes the host-memory and disk tiers from ``--kv-host-gb`` /
``--kv-offload-dir`` / ``--kv-offload-gb``, opens the disk tier's StorageBackend in the
directory of this model and KV layout (:func:`~atlas_core.engine.kv_disk.kv_namespace`) and
hands the tiers to the block manager (and its sliding-window pool, with tiers and a disk
namespace of their own, and, on hybrid models, the state cache), with the
read-or-recompute policy of ``--kv-disk-restore`` for the disk tier (state snapshots are always
read: without one the prefix is not usable). Bad directories fail here, before any request,
with a message that says how to fix them.
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from atlas_core.engine.kv_block_io import KVBlockIO, paged_kv_pools
from atlas_core.engine.kv_disk import DiskTier, kv_namespace
from atlas_core.engine.kv_restore import DiskRestorePolicy
from atlas_core.engine.kv_sizing import kv_specs
from atlas_core.engine.kv_tiers import KVTiers
from atlas_core.engine.outputs import EngineStats
from atlas_core.engine.window_blocks import is_windowed

log = logging.getLogger(__name__)

_GIB = 1 << 30
#: Fraction of --kv-host-gb / --kv-offload-gb given to hybrid models' state snapshots.
STATE_SHARE = 0.25
#: Below this much free space the offload directory counts as full.
MIN_FREE_BYTES = 64 << 20


def with_tier_stats(stats: EngineStats, tiers: "KVTiers | None") -> EngineStats:
    """``stats`` with a ``kv_tiers`` field holding ``tiers.stats()`` (unchanged without tiers)."""
    if tiers is None:
        return stats
    return replace(stats, kv_tiers=tiers.stats())


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


def split_kv_pools(model: Any, runner: Any) -> tuple[list, list]:
    """``runner``'s paged K/V pools: those of the main block pool, and those of the sliding-window
    pool (:mod:`atlas_core.engine.window_blocks`; empty without one)."""
    if getattr(runner.kv, "window_pool", None) is None:
        return paged_kv_pools(runner.kv_caches), []
    main, window = [], []
    for spec, layer in zip(kv_specs(model), runner.kv_caches):
        if isinstance(layer, tuple):
            (window if is_windowed(spec) else main).extend(layer)
    return main, window


def create_kv_tiers(args: Any, model: Any, runner: Any, scheduler: Any) -> KVTiers | None:
    """The tiers ``args`` ask for below ``runner``'s pools, set as the ``tiers`` of
    ``scheduler``'s block manager (and of its window pool, and of the state cache on hybrid
    models); ``None`` when neither host memory nor disk is asked for.

    Each pool's tiers get a share of ``--kv-host-gb`` / ``--kv-offload-gb``: the state snapshots
    :data:`STATE_SHARE`, the main and window pools the rest in proportion to their bytes per
    block, so both hold as many blocks."""
    host_bytes = int(float(args.kv_host_gb or 0) * _GIB)
    if not args.enable_prefix_caching or (not host_bytes and not args.kv_offload_dir):
        return None
    kv = runner.kv
    main_pools, window_pools = split_kv_pools(model, runner)
    io = KVBlockIO(runner.backend, main_pools)
    if not io.pools:
        log.info("KV tiers: the model has no paged KV cache; tiers are off")
        return None
    window_io = KVBlockIO(runner.backend, window_pools) if window_pools else None
    extra = None
    if window_io is not None:
        extra = {"window": kv.window_pool.window,
                 "window_layout": [list(p.shape[1:]) for p in window_pools]}
    root = check_offload_dir(args.kv_offload_dir) if args.kv_offload_dir else None
    # the per-layer dtypes (--kv-high-precision-layers) change what a block's bytes mean
    kv_dtype = kv.dtype_summary if len(set(kv.layer_dtypes) - {None}) > 1 else kv.dtype
    name, identity = kv_namespace(model, args.model, kv_dtype, kv.block_size,
                                  [tuple(p.shape[1:]) for p in io.pools], extra)
    max_staged = 4 * -(-kv.max_seq_len // kv.block_size)
    states = scheduler.state_cache
    hybrid = bool(states is not None and states.num_snapshots and runner.state_pools)
    rest = 1 - (STATE_SHARE if hybrid else 0.0)
    window_bytes = window_io.block_bytes if window_io is not None else 0
    main = rest * io.block_bytes / (io.block_bytes + window_bytes)
    tiers = _tiers(args, io, int(host_bytes * main), main, root, name, identity, max_staged)
    if tiers.disk is not None:
        tiers.restore = DiskRestorePolicy(getattr(args, "kv_disk_restore", "auto"), kv.block_size)
    scheduler.block_manager.tiers = tiers
    if window_io is not None:
        share = rest - main
        tiers.window = scheduler.block_manager.window_pool.tiers = _tiers(
            args, window_io, int(host_bytes * share), share, root, f"{name}-window", identity,
            max_staged)
    if hybrid:
        state_io = KVBlockIO(runner.backend, runner.state_pools)
        tiers.state = states.tiers = _tiers(args, state_io, int(host_bytes * STATE_SHARE),
                                            STATE_SHARE, root, f"{name}-state", identity,
                                            max_staged)
    return tiers


def _tiers(args: Any, io: KVBlockIO, host_bytes: int, disk_share: float, root: Path | None,
           name: str, identity: dict, max_staged: int) -> KVTiers:
    disk = None
    if root is not None:
        storage = create_storage(getattr(args, "kv_storage", "auto"), root / name)
        (root / f"{name}.json").write_text(json.dumps(identity, indent=1) + "\n")
        disk = DiskTier(storage, io.block_bytes,
                        int(disk_share * _disk_capacity(args, root, storage)))
        log.info("KV disk tier: %s through the %s storage backend, %d entries of %.2f MiB from "
                 "earlier runs", root / name, type(storage).__name__, disk.num_loaded_at_start,
                 io.block_bytes / (1 << 20))
    return KVTiers(io, host_bytes, disk, max_staged)


def _disk_capacity(args: Any, root: Path, storage: Any) -> int:
    want = int(float(args.kv_offload_gb) * _GIB)
    free = shutil.disk_usage(root).free + storage.used_bytes()
    if free < MIN_FREE_BYTES:
        raise ValueError(f"--kv-offload-dir {root} is full ({free / (1 << 20):.0f} MiB free); "
                         "free space there, pick another directory or leave the flag out")
    if want > free:
        log.warning("--kv-offload-gb %.1f is more than the %.1f GiB free in %s; using %.1f GiB",
                    want / _GIB, free / _GIB, root, 0.9 * free / _GIB)
        want = int(0.9 * free)
    return want
