"""What each kernel of a decode step (batch 1, or ``--batch N``) adds to the step, in the replayed
graph.

Builds the bench model with ``ATLAS_CUDA_NVRTC_DEFINES=ATLAS_TRACE`` (a separate kernel-cache
entry): every launch's block 0 records when it reached ``pdl_wait()`` and when the wait returned
(common.cuh). With PDL a wait returns once the previous kernel has finished and its writes are
visible, so the gap between two consecutive wait returns is what the earlier kernel costs the
step (its work after the wait plus the kernel boundary), including what overlap hides, without
leaving anything out (compare scripts/decode_leave_one_out.py). Per kernel (module, kernel names
of that grid shape): launches a step, median and total microseconds a step, and how early the
block reached its wait (lead: the pre-wait work overlapped with the kernel before).

Kernels captured into the graph that left no trace (no ``pdl_wait()``, so their time lands in the
row before them) are listed after the table.

``--tp N`` times rank 0 of a TP=N split alone, its collectives left out (bench/rank_model);
``--ranks N`` runs the real split on N GPUs, one process a rank over NCCL (and the peer-memory
all-reduce), every rank replaying the same graphs so the collectives pair up, and prints each
rank's table: the all-reduce kernels' rows are what communication costs inside the step.

    python scripts/decode_timeline.py qwen3-30b-a3b [--prompt 512] [--batch 8] [--reps 20]
    python scripts/decode_timeline.py qwen3-8b --ranks 2 [--ep]
"""

from __future__ import annotations

import argparse
import multiprocessing
from collections import defaultdict

import numpy as np

SLOTS = 8192


#: (module, grid, kernel) of every launch of the graph being captured now, and each captured
#: graph's list by ``id(graph)`` (a decode_graph engine captures every bucket up to the batch).
CAPTURED: list[tuple[str, tuple, str]] = []
GRAPH_LAUNCHES: dict[int, list] = {}


def name_launches() -> dict:
    """Record every launch's (module, grid) -> kernel names, by hooking the kernel library's
    class (a backend re-binds its library per model, so instance hooks would be lost), and the
    launches captured into each graph (:data:`GRAPH_LAUNCHES`)."""
    from atlas_cuda.graphs import GraphCapture
    from atlas_cuda.kernels_loader import KernelLibrary, kernel_family
    names: dict[tuple[str, tuple], set] = defaultdict(set)
    kernel, launch = KernelLibrary.kernel, KernelLibrary.launch
    meta: dict[int, tuple[str, str]] = {}

    def named_kernel(self, module, variant, name, *args, **kw):
        k = kernel(self, module, variant, name, *args, **kw)
        meta[id(k)] = (module, kernel_family(name))
        return k

    def noting_launch(self, k, grid, *args, **kw):
        module, name = meta.get(id(k), ("?", "?"))
        g = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        names[(module, (g + (1, 1))[:3])].add(name)
        if getattr(self.backend, "capturing", False):
            CAPTURED.append((module, (g + (1, 1))[:3], name))
        launch(self, k, grid, *args, **kw)

    capture = GraphCapture.capture

    def noting_capture(self, fn):
        CAPTURED.clear()
        graph = capture(self, fn)
        GRAPH_LAUNCHES[id(graph)] = list(CAPTURED)
        return graph

    KernelLibrary.kernel, KernelLibrary.launch = named_kernel, noting_launch
    GraphCapture.capture = noting_capture
    return names


def timeline(be, model, names: dict, a, tag: str = "") -> None:
    """Replay the model's decode graph ``a.reps`` times and print the per-kernel table."""
    from atlas_core.bench.graph_timing import decode_graph, replay_ms
    from atlas_cuda.driver import check, drv
    from atlas_cuda.kernels_loader import module_global
    _engine, graph = decode_graph(model, be, a.prompt, batch=a.batch)
    step_ms = replay_ms(be, graph, 50)
    print(f"{tag}{a.model}: decode graph of {a.batch} {step_ms:.3f} ms (tracing build), "
          f"{model.num_layers} layers, {a.prompt} tokens of context")
    d = drv()
    lib = be.kernels
    arrays = [(module, ptr) for (module, _v), mod in lib.modules.items()
              if (ptr := module_global(mod, "atlas_trace")) is not None]
    nbytes = SLOTS * 4 * 8
    host = np.zeros((SLOTS, 4), np.uint64)
    cost: dict[str, list] = defaultdict(list)
    lead: dict[str, list] = defaultdict(list)
    per_step: dict[str, list] = defaultdict(list)
    spans, last = [], []
    for _ in range(a.reps):
        be.synchronize()
        for _m, ptr in arrays:
            check(d.cuMemsetD8(ptr, 0, nbytes))
        graph.replay()
        be.synchronize()
        recs = []
        for module, ptr in arrays:
            check(d.cuMemcpyDtoH(host.ctypes.data, ptr, nbytes))
            for gid, t0, t1, shape in host[host[:, 0] > 0].astype(np.int64):
                g = (int(shape) & 0x1FFFFF, (int(shape) >> 21) & 0x1FFFFF, int(shape) >> 42)
                label = f"{module}:{'/'.join(sorted(names.get((module, g), {'?'})))} {g}"
                recs.append((t1, t0, label))
        recs.sort()
        spans.append((recs[-1][0] - recs[0][0]) / 1e3)
        counts: dict[str, float] = defaultdict(float)
        for i in range(len(recs) - 1):
            t1, t0, label = recs[i]
            dt = (recs[i + 1][0] - t1) / 1e3
            cost[label].append(dt)
            lead[label].append((t1 - t0) / 1e3)
            counts[label] += dt
        for label, v in counts.items():
            per_step[label].append(v)
        last = recs
    lines = [f"{tag}{len(last)} traced launches a step (wait return of the first to the last: "
             f"{np.median(spans):.1f} us, median of {a.reps} replays)",
             f"{tag}{'kernel (module:names grid)':70s} {'n':>4s} {'us each':>8s} "
             f"{'us/step':>8s} {'lead us':>8s}"]
    for label in sorted(per_step, key=lambda k: -np.median(per_step[k])):
        n = len(cost[label]) / a.reps
        lines.append(f"{tag}{label[:70]:70s} {n:4.0f} {np.median(cost[label]):8.2f} "
                     f"{np.median(per_step[label]):8.1f} {np.median(lead[label]):8.2f}")
    lines.append(f"{tag}last {a.show} launches of the last replay (us from the first wait "
                 "return):")
    base = last[0][0]
    for i, (t1, t0, label) in enumerate(last[-a.show:] if a.show else []):
        j = len(last) - a.show + i
        nxt = last[j + 1][0] if j + 1 < len(last) else None
        dt = f"{(nxt - t1) / 1e3:7.2f}" if nxt is not None else "      -"
        lines.append(f"{tag}  {label[:66]:66s} wait {(t0 - base) / 1e3:9.2f} -> "
                     f"{(t1 - base) / 1e3:9.2f} (+{dt})")
    lines += untraced(GRAPH_LAUNCHES.get(id(graph), []), last, tag)
    print("\n".join(lines), flush=True)


def untraced(launches: list, last: list, tag: str) -> list[str]:
    """Lines naming the kernels captured into the timed graph (``launches``) that left no trace
    (no ``pdl_wait()``: their time shows in the row of the traced kernel before them), by
    (module, grid) counts."""
    traced: dict[tuple, int] = defaultdict(int)
    for _t1, _t0, label in last:
        module, rest = label.split(":", 1)
        traced[(module, rest[rest.rindex(" (") + 1:])] += 1
    captured: dict[tuple, int] = defaultdict(int)
    kernels: dict[tuple, set] = defaultdict(set)
    for module, grid, name in launches:
        captured[(module, str(grid))] += 1
        kernels[(module, str(grid))].add(name)
    missing = {k: n - traced.get(k, 0) for k, n in captured.items() if n > traced.get(k, 0)}
    if not missing:
        return []
    out = [f"{tag}launches captured but not traced ({sum(captured.values())} captured in all, "
           f"{len(last)} traced a step; a kernel without pdl_wait() is timed with the one "
           "before it):"]
    for (module, grid), n in sorted(missing.items(), key=lambda kv: -kv[1]):
        out.append(f"{tag}  {module}:{'/'.join(sorted(kernels[(module, grid)]))} {grid} x{n}")
    return out


def _rank(rank: int, a, store_port: int) -> None:
    from atlas_cuda.compiler import add_define
    add_define("ATLAS_TRACE")
    names = name_launches()
    from atlas_core.bench.shapes import shape_config
    from atlas_core.model.loader import architecture, create_loader
    from atlas_core.parallel.store import StoreClient
    from atlas_core.parallel.transform import build_random_shard
    from atlas_core.plugins import Registry
    registry = Registry()
    be = registry.create("gpu_backends", "cuda", device_id=rank)
    comm = registry.create("comm_backends", "nccl", rank=rank, world_size=a.ranks, backend=be,
                           store=StoreClient("127.0.0.1", store_port, 120), timeout=120)
    config = shape_config(a.model)
    model = build_random_shard(create_loader(registry, architecture(config)), config, be, comm,
                               expert_parallel=a.ep)
    comm.barrier()
    timeline(be, model, names, a, tag=f"[rank {rank}] " if rank else "")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--prompt", type=int, default=128, help="tokens of context a sequence")
    p.add_argument("--batch", type=int, default=1, help="sequences in the step")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--show", type=int, default=12, help="print the step's last N launches")
    p.add_argument("--tp", type=int, default=1,
                   help="time rank 0 of a TP=N split, collectives left out (bench/rank_model)")
    p.add_argument("--ranks", type=int, default=1,
                   help="the real split over N GPUs (one process a rank, NCCL)")
    p.add_argument("--ep", action="store_true", help="with --tp / --ranks: expert parallel")
    a = p.parse_args()
    if a.ranks > 1:
        from atlas_core.parallel.store import StoreServer
        ctx = multiprocessing.get_context("spawn")
        store = StoreServer()  # the rendezvous the nccl comm needs, as `atlas serve -tp` has
        procs = [ctx.Process(target=_rank, args=(r, a, store.port)) for r in range(a.ranks)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        store.close()
        raise SystemExit(max(proc.exitcode or 0 for proc in procs))
    from atlas_cuda.compiler import add_define
    add_define("ATLAS_TRACE")
    names = name_launches()
    from atlas_core.bench.random_model import build_random_model
    from atlas_core.bench.rank_model import build_rank_model
    from atlas_core.bench.shapes import shape_config
    from atlas_core.engine.loading import create_backend
    be, registry = create_backend("cuda")
    model = (build_rank_model(shape_config(a.model), be, registry, a.tp, a.ep) if a.tp > 1
             else build_random_model(shape_config(a.model), be, registry))
    timeline(be, model, names, a)


if __name__ == "__main__":
    main()
