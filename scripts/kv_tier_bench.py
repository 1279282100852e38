"""Time to first token of a long prompt served cold, from the GPU prefix cache, from the host
tier and from the disk tier; the disk tier's read bandwidth against the raw O_DIRECT read
bandwidth of the same directory, measured in the same run. Prints one table.

    python scripts/kv_tier_bench.py --model qwen3-8b --offload-dir /nvme/atlas-kv \
        [--prompt-tokens 32768] [--kv-host-gb 16] [--storage auto|io_uring|posix]

``--model``: a checkpoint directory, or a named bench shape (random weights on the device).
Each row runs the same prompt with ``max_tokens=1``: ``cold`` (nothing cached), ``gpu`` (the
device prefix cache), ``host`` (device cache dropped after spilling to host memory), ``disk``
(device and host dropped, page cache dropped when the script may, blocks read back through the
storage backend; ``--kv-disk-restore always``, so the disk path is measured even where the
engine would recompute). The line after the table says what ``auto`` would choose for this
prompt from the rates measured in the run; the last line splits a disk restore into its
two stages (disk -> the host tier's page-locked rows with checksums, then rows -> device).
``raw O_DIRECT`` reads a scratch file as large as the prompt's blocks with
queue depth 32 x 4 MiB, through io_uring when the kernel allows it, else threads.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import time
from pathlib import Path

import numpy as np

from atlas_core.bench.random_model import engine_for
from atlas_core.engine import SamplingParams
from atlas_core.engine.kv_disk import CHECKSUM_THREADS
from atlas_core.engine.kv_tiers import close_kv_tiers

CHUNK, DEPTH = 4 << 20, 32


def ttft(engine, tokens: list[int], rid: str) -> tuple[float, int]:
    """Seconds until the first (only) token, and the prompt tokens served from a cache."""
    start = time.perf_counter()
    engine.add_request(rid, tokens, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                return time.perf_counter() - start, out.num_cached_tokens
    raise RuntimeError("the request never finished")


def drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def raw_direct_read_gbps(directory: Path, nbytes: int) -> tuple[float, str]:
    """GB/s reading a fresh ``nbytes`` file in ``directory`` with O_DIRECT at queue depth 32."""
    path = directory / ".atlas-raw-read-probe"
    nbytes = max(CHUNK, nbytes // CHUNK * CHUNK)
    block = os.urandom(CHUNK)
    with open(path, "wb") as f:
        for _ in range(nbytes // CHUNK):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    drop_page_cache()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            return _read_io_uring(fd, nbytes), "io_uring"
        except ImportError:
            return _read_threads(fd, nbytes), "threads"
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)


def _read_io_uring(fd: int, nbytes: int) -> float:
    from atlas_iouring.ring import IORING_OP_READ, Ring, aligned_buffer
    ring = Ring(DEPTH)
    bufs = [aligned_buffer(CHUNK) for _ in range(DEPTH)]
    offsets = iter(range(0, nbytes, CHUNK))
    start = time.perf_counter()
    free, done = list(range(DEPTH)), 0
    while done < nbytes:
        while free:
            offset = next(offsets, None)
            if offset is None:
                break
            slot = free.pop()
            ring.push(IORING_OP_READ, fd, bufs[slot][1], CHUNK, offset, slot)
        ring.submit(wait=1)
        for slot, res in ring.reap():
            if res <= 0:
                raise OSError(-res, os.strerror(-res))
            done += res
            free.append(slot)
    seconds = time.perf_counter() - start
    ring.close()
    return nbytes / seconds / 1e9


def _read_threads(fd: int, nbytes: int) -> float:
    import mmap

    def read(offset):
        buf = mmap.mmap(-1, CHUNK)
        os.preadv(fd, [buf], offset)
        buf.close()
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(DEPTH) as pool:
        list(pool.map(read, range(0, nbytes, CHUNK)))
    return nbytes / (time.perf_counter() - start) / 1e9


def tier_restore_stages(engine, tokens: list[int]) -> dict:
    """The two stages of a disk restore of every block of ``tokens``, timed apart: disk ->
    the host tier's page-locked rows (what a prefetch does: reads in place, checksums on the
    checksum threads), then rows -> device blocks (one DMA per block, waited on by event).
    Leaves garbage in free device blocks: run it last."""
    tiers, bm = engine.kv_tiers, engine.block_manager
    disk = tiers.disk
    hashes = [h for h in _hashes(bm, tokens) if disk.contains(h)]
    verify = disk.verify_seconds
    start = time.perf_counter()
    tiers.prefetch(hashes)
    while disk.reads:
        tiers.wait_reads()
    tiers.poll()
    read_s = time.perf_counter() - start
    in_rows = sum(h in tiers.staged_rows for h in hashes)
    payloads = tiers.take(hashes)
    n = min(len(payloads), tiers.io.pools[0].shape[0])
    start = time.perf_counter()
    tiers.write(list(range(n)), payloads[:n]).wait()
    h2d_s = time.perf_counter() - start
    return {"read_gbps": len(hashes) * disk.record_size / read_s / 1e9, "read_s": read_s,
            "verify_cpu_s": disk.verify_seconds - verify, "in_rows": in_rows,
            "blocks": len(hashes), "h2d_s": h2d_s,
            "h2d_gbps": n * tiers.io.block_bytes / h2d_s / 1e9 if n else 0.0}


def auto_choice(engine, nbytes: int) -> str:
    """What ``--kv-disk-restore auto`` would do with ``nbytes`` of this prompt's blocks on disk,
    from the read and prefill rates the engine measured in this run."""
    tiers = engine.kv_tiers
    disk_rate, prefill_rate = tiers.disk.read_rate.rate, tiers.restore.prefill_rate.rate
    read_s, recompute_s = tiers.restore.estimate(nbytes // tiers.disk.record_size,
                                                 tiers.disk.record_size, disk_rate)
    if recompute_s is None:
        return "auto: no prefill step timed, would read"
    choice = "read" if read_s <= recompute_s else "recompute"
    return (f"auto: would {choice} (read {read_s:.2f} s at {(disk_rate or 0) / 1e9:.2f} GB/s "
            f"measured, recompute {recompute_s:.2f} s at {prefill_rate:.0f} prefill tokens/s)")


def _hashes(bm, tokens: list[int]) -> list[bytes]:
    from atlas_core.engine.block_manager import block_hash
    out, parent, bs = [], None, bm.block_size
    for i in range((len(tokens) - 1) // bs):
        parent = block_hash(parent, tokens[i * bs:(i + 1) * bs])
        out.append(parent)
    return out


def forget_lower(engine, keep_host: bool) -> None:
    """Spill the device prefix cache to the tiers, then drop it (and host memory unless kept).

    Returns once the spill's device -> host copies have landed in the host rows: a spill only
    queues them (it records an event, it does not synchronize), and the next row's restore
    copies and forward queue behind them on the one stream, so without the wait the ``host``
    row would also time the spill it was set up by (all 4.8 GB of it at 32k tokens)."""
    bm, tiers = engine.block_manager, engine.kv_tiers
    bm.flush_to_tiers()
    engine.backend.synchronize()
    bm.reset_prefix_cache()
    if not keep_host:
        tiers.clear_memory()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="Qwen/Qwen3-8B")
    p.add_argument("--backend", default=None)
    p.add_argument("--offload-dir", required=True)
    p.add_argument("--prompt-tokens", type=int, default=32768)
    p.add_argument("--kv-host-gb", type=float, default=16.0)
    p.add_argument("--storage", default="auto")
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--max-prefill-tokens", type=int, default=8192)
    a = p.parse_args()
    engine = engine_for(a.model, a.backend, max_num_seqs=1, max_seq_len=a.prompt_tokens + 16,
                        max_prefill_tokens=a.max_prefill_tokens, num_kv_blocks=a.num_kv_blocks,
                        kv_host_gb=a.kv_host_gb, kv_offload_dir=a.offload_dir,
                        kv_offload_gb=4 * a.kv_host_gb, kv_storage=a.storage,
                        kv_disk_restore="always")
    vocab = engine.model.vocab_size
    rng = np.random.default_rng(0)
    tokens = rng.integers(100, vocab - 100, a.prompt_tokens).tolist()
    ttft(engine, rng.integers(100, vocab - 100, min(512, a.prompt_tokens)).tolist(), "warm-up")
    rows = [("cold", *ttft(engine, tokens, "cold"))]
    rows.append(("gpu", *ttft(engine, tokens, "gpu")))
    forget_lower(engine, keep_host=True)
    rows.append(("host", *ttft(engine, tokens, "host")))
    forget_lower(engine, keep_host=False)
    dropped = drop_page_cache()
    rows.append(("disk", *ttft(engine, tokens, "disk")))
    forget_lower(engine, keep_host=False)
    drop_page_cache()
    stages = tier_restore_stages(engine, tokens)
    tier_gbps = stages["read_gbps"]
    nbytes = len(_hashes(engine.block_manager, tokens)) * engine.kv_tiers.disk.record_size
    raw_gbps, raw_via = raw_direct_read_gbps(Path(a.offload_dir), nbytes)
    storage = type(engine.kv_tiers.disk.storage).__name__
    auto = auto_choice(engine, nbytes)
    close_kv_tiers(engine)
    print(f"\n{a.model}, {a.prompt_tokens} prompt tokens, KV {nbytes / 1e9:.2f} GB on disk, "
          f"storage {storage}, page cache {'dropped' if dropped else 'NOT dropped (not root)'}")
    print(f"{'source':<14}{'TTFT s':>10}{'cached tokens':>15}")
    for name, seconds, cached in rows:
        print(f"{name:<14}{seconds:>10.3f}{cached:>15}")
    print(f"{'disk tier read':<14}{tier_gbps:>9.2f} GB/s ({tier_gbps / raw_gbps:.0%} of raw)")
    print(f"{'raw O_DIRECT':<14}{raw_gbps:>9.2f} GB/s (QD {DEPTH} x 4 MiB via {raw_via})")
    print(auto)
    print(f"disk restore stages: disk -> pinned rows {stages['read_s']:.3f} s "
          f"({stages['in_rows']}/{stages['blocks']} blocks read in place, checksums "
          f"{stages['verify_cpu_s']:.2f} CPU-s on {CHECKSUM_THREADS} threads), rows -> device "
          f"{stages['h2d_s']:.3f} s ({stages['h2d_gbps']:.1f} GB/s)")


if __name__ == "__main__":
    main()
