"""NCCL all-reduce through atlas-nccl's comm backend, on the cuda backend's stream: time per
all-reduce of decode-sized activations (eager and replayed from one CUDA graph, as the decode
steps run them) through NCCL and through the peer-memory kernel in each protocol (pull, push
and ll, switched on every rank at once), and bus bandwidth of large ones, against the link's.

    python scripts/allreduce_bench.py [-n 2] [--hidden 4096] [--layers 36] [--link-gbs 450]

Per decode step a tensor-parallel dense model does ``2 * layers + 1`` all-reduces of
``batch x hidden`` (after o_proj and down_proj, and the embedding) plus one logits all-gather.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time

import numpy as np

#: The peer-memory kernel's protocols timed after NCCL (atlas_nccl.p2p.MODES), in column order.
P2P_MODES = ("pull", "push", "ll")


def _rank(rank: int, args: argparse.Namespace, port: int, out) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    from atlas_core.api import Registry, bfloat16
    from atlas_core.parallel.store import StoreClient
    registry = Registry()
    backend = registry.create("gpu_backends", "cuda", device_id=0)
    comm = registry.create("comm_backends", "nccl", rank=rank, world_size=args.n, backend=backend,
                           store=StoreClient("127.0.0.1", port, 120), timeout=120)
    rows = {}

    def timed(reduce, x):
        for _ in range(5):
            reduce(x)
        backend.synchronize()
        start = time.perf_counter()
        for _ in range(50):
            reduce(x)
        backend.synchronize()
        eager = (time.perf_counter() - start) / 50
        graph = backend.capture(lambda: [reduce(x) for _ in range(10)])
        graph.replay()
        backend.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            graph.replay()
        backend.synchronize()
        return eager, (time.perf_counter() - start) / 200

    modes = P2P_MODES if comm._p2p is not None else ()
    for batch in (1, 8, 32, 128):
        x = backend.from_host(np.ones((batch, args.hidden), bfloat16))
        rows[batch] = list(timed(comm.nccl_all_reduce, x))
        for mode in modes:
            comm._p2p.mode = mode
            rows[batch] += timed(comm.all_reduce, x)
    big = backend.from_host(np.ones(128 << 20 >> 1, bfloat16))
    comm.all_reduce(big)
    backend.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        comm.all_reduce(big)
    backend.synchronize()
    seconds = (time.perf_counter() - start) / 10
    busbw = big.nbytes * 2 * (args.n - 1) / args.n / seconds / 1e9
    out.put((rank, rows, busbw, comm._p2p is not None))
    comm.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=2, help="GPUs")
    p.add_argument("--hidden", type=int, default=4096, help="qwen3-8b: 4096")
    p.add_argument("--layers", type=int, default=36, help="qwen3-8b: 36")
    p.add_argument("--link-gbs", type=float, default=450.0,
                   help="GPU-to-GPU bandwidth per direction (H100/H200 NVLink 4: 450 GB/s)")
    args = p.parse_args()
    from atlas_core.parallel.store import StoreServer
    store = StoreServer()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, args, store.port, out)) for r in range(args.n)]
    for proc in procs:
        proc.start()
    results = {r: rest for r, *rest in (out.get(timeout=300) for _ in procs)}
    for proc in procs:
        proc.join(30)
    rows, busbw, p2p = results[0]
    per_step = 2 * args.layers + 1
    print(f"{args.n} GPUs, bf16, hidden {args.hidden}; peer-memory all-reduce "
          f"{'on' if p2p else 'OFF (NCCL only)'}")
    names = ["NCCL"] + (list(P2P_MODES) if p2p else [])
    print("batch | KB | " + " | ".join(f"{n} eager us | {n} graph us" for n in names)
          + f" | {per_step} per step ({' / '.join(names)}, graph) ms")
    for batch, times in rows.items():
        cells = " | ".join(f"{t * 1e6:6.1f}" for t in times)
        step = " / ".join(f"{per_step * t * 1e3:.2f}" for t in times[1::2])
        print(f"{batch:>5} | {batch * args.hidden * 2 >> 10:>4} | {cells} | {step}")
    print(f"256 MiB all-reduce: bus bandwidth {busbw:.0f} GB/s ({100 * busbw / args.link_gbs:.0f}% "
          f"of {args.link_gbs:.0f} GB/s)")


if __name__ == "__main__":
    main()
