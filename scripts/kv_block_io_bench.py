"""Seconds (and GB/s) to move KV blocks between device pools and host memory (KVBlockIO read and
write, a host-tier spill and restore) and, with ``--offload-dir``, through the disk tier (spill
to disk, read back with checksums, restore) against the raw O_DIRECT read bandwidth of the same
directory. Any backend (numpy by default); one table.

    python scripts/kv_block_io_bench.py [--backend numpy|cuda] [--blocks 2000] [--pools 72]
        [--row-shape 16,8,128] [--dtype bfloat16] [--shuffle] [--offload-dir DIR]
        [--storage auto|io_uring|posix]

The default shape is qwen3-8b's: 36 layers of K and V pools of ``[blocks, 16, 8, 128]`` bf16,
2.36 MB a block. Block ids are consecutive, or a random permutation with ``--shuffle``. Host rows
come from the backend's ``empty_pinned`` (page-locked on cuda) and are touched before timing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from atlas_core.engine.kv_block_io import KVBlockIO
from atlas_core.engine.kv_disk import DiskTier
from atlas_core.engine.kv_tier_setup import create_storage
from atlas_core.engine.kv_tiers import KVTiers
from atlas_core.plugins import Registry


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def host_rows(io: KVBlockIO, ids: list[int], hashes: list[bytes]) -> list[tuple[str, float]]:
    """read / write through pinned host rows, then a host-tier spill and restore."""
    rows = io.backend.empty_pinned((len(ids), io.block_bytes), np.uint8)
    rows.fill(1)
    dests = list(rows)
    out = [("read", timed(io.read_into, ids, dests)), ("write", timed(io.write, ids, dests))]
    del rows, dests
    tiers = KVTiers(io, host_bytes=len(ids) * io.block_bytes, disk=None)
    # Spills and restores return with their copies queued: time them until those complete.
    out.append(("spill to host", timed(lambda: (tiers.spill(list(zip(ids, hashes))),
                                                 io.backend.synchronize()))))
    out.append(("restore from host", timed(lambda: tiers.write(ids, tiers.take(hashes)).wait())))
    return out


def disk_rows(io: KVBlockIO, ids: list[int], hashes: list[bytes], root: Path,
              storage: str) -> tuple[list[tuple[str, float]], str]:
    """Spill to a disk-only tier (until written), read every block back, restore; raw read."""
    sys.path.insert(0, str(Path(__file__).parent))
    from kv_tier_bench import drop_page_cache, raw_direct_read_gbps
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        store = create_storage(storage, Path(tmp) / "blocks")
        disk = DiskTier(store, io.block_bytes, 2 * len(ids) * (io.block_bytes + 64))
        tiers = KVTiers(io, host_bytes=0, disk=disk)
        start = time.perf_counter()
        tiers.spill(list(zip(ids, hashes)))
        disk.flush(600)
        out = [("spill to disk", time.perf_counter() - start)]
        drop_page_cache()
        start = time.perf_counter()
        while tiers.prefetch(hashes) is None:
            tiers.wait_reads()
        out.append(("disk tier read", time.perf_counter() - start))
        out.append(("restore staged",
                    timed(lambda: tiers.write(ids, tiers.take(hashes)).wait())))
        gbps, via = raw_direct_read_gbps(Path(tmp), len(ids) * disk.record_size)
        out.append((f"raw O_DIRECT ({via})", len(ids) * disk.record_size / gbps / 1e9))
        tiers.close()
        return out, type(store).__name__


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="numpy")
    p.add_argument("--blocks", type=int, default=2000)
    p.add_argument("--pools", type=int, default=72)
    p.add_argument("--row-shape", default="16,8,128")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--offload-dir", default=None)
    p.add_argument("--storage", default="auto")
    a = p.parse_args()
    backend = Registry().create("gpu_backends", a.backend)
    shape = (a.blocks, *(int(s) for s in a.row_shape.split(",")))
    pools = [backend.empty(shape, a.dtype) for _ in range(a.pools)]
    backend.fill_random(pools[0], 0, 1.0)
    for pool in pools[1:]:
        backend.copy_(pool, pools[0])
    io = KVBlockIO(backend, pools)
    ids = list(range(a.blocks))
    if a.shuffle:
        ids = np.random.default_rng(0).permutation(a.blocks).tolist()
    hashes = [i.to_bytes(16, "little") for i in range(len(ids))]
    gb = len(ids) * io.block_bytes / 1e9
    rows, storage = host_rows(io, ids, hashes), ""
    if a.offload_dir:
        more, storage = disk_rows(io, ids, hashes, Path(a.offload_dir), a.storage)
        rows += more
    print(f"{a.backend}: {len(ids)} blocks x {a.pools} pools of {shape[1:]} {a.dtype}, "
          f"{io.block_bytes / 1e6:.2f} MB a block, {gb:.2f} GB"
          + (f"; disk through {storage}" if storage else ""))
    for name, seconds in rows:
        print(f"{name:<24}{seconds:>8.3f} s{gb / seconds:>8.2f} GB/s")


if __name__ == "__main__":
    main()
