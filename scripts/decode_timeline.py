"""What each kernel of a batch-1 decode step adds to the step, in the replayed graph.

Builds the bench model with ``ATLAS_CUDA_NVRTC_DEFINES=ATLAS_TRACE`` (a separate kernel-cache
entry): every launch's block 0 records when it reached ``pdl_wait()`` and when the wait returned
(common.cuh). With PDL a wait returns once the previous kernel has finished and its writes are
visible, so the gap between two consecutive wait returns is what the earlier kernel costs the
step (its work after the wait plus the kernel boundary), including what overlap hides, without
leaving anything out (compare scripts/decode_leave_one_out.py). Per kernel (module, kernel names
of that grid shape): launches a step, median and total microseconds a step, and how early the
block reached its wait (lead: the pre-wait work overlapped with the kernel before).

    python scripts/decode_timeline.py qwen3-30b-a3b [--prompt 512] [--reps 20] [--show 12]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

SLOTS = 8192


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--show", type=int, default=12, help="print the step's last N launches")
    p.add_argument("--tp", type=int, default=1,
                   help="time rank 0 of a TP=N split, collectives left out (bench/rank_model)")
    p.add_argument("--ep", action="store_true", help="with --tp: expert parallel")
    a = p.parse_args()
    from atlas_cuda.compiler import add_define
    add_define("ATLAS_TRACE")
    from atlas_core.bench.graph_timing import decode_graph, replay_ms
    from atlas_core.bench.random_model import build_random_model
    from atlas_core.bench.rank_model import build_rank_model
    from atlas_core.bench.shapes import shape_config
    from atlas_core.engine.loading import create_backend
    from atlas_cuda.driver import check, drv
    from atlas_cuda.kernels_loader import kernel_family, module_global

    be, registry = create_backend("cuda")
    lib = be.kernels
    kernel, launch = lib.kernel, lib.launch
    meta: dict[int, tuple[str, str]] = {}
    names: dict[tuple[str, tuple], set] = defaultdict(set)

    def named_kernel(module, variant, name, *args, **kw):
        k = kernel(module, variant, name, *args, **kw)
        meta[id(k)] = (module, kernel_family(name))
        return k

    def noting_launch(k, grid, *args, **kw):
        module, name = meta.get(id(k), ("?", "?"))
        g = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        g = (g + (1, 1))[:3]
        names[(module, g)].add(name)
        launch(k, grid, *args, **kw)

    lib.kernel, lib.launch = named_kernel, noting_launch
    model = (build_rank_model(shape_config(a.model), be, registry, a.tp, a.ep) if a.tp > 1
             else build_random_model(shape_config(a.model), be, registry))
    _engine, graph = decode_graph(model, be, a.prompt)
    step_ms = replay_ms(be, graph, 50)
    print(f"{a.model}: decode graph {step_ms:.3f} ms (tracing build), {model.num_layers} layers")
    d = drv()
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
    n_launch = len(last)
    print(f"{n_launch} traced launches a step (wait return of the first to the last: "
          f"{np.median(spans):.1f} us, median of {a.reps} replays)")
    print(f"{'kernel (module:names grid)':70s} {'n':>4s} {'us each':>8s} {'us/step':>8s} "
          f"{'lead us':>8s}")
    for label in sorted(per_step, key=lambda k: -np.median(per_step[k])):
        n = len(cost[label]) / a.reps
        print(f"{label[:70]:70s} {n:4.0f} {np.median(cost[label]):8.2f} "
              f"{np.median(per_step[label]):8.1f} {np.median(lead[label]):8.2f}")
    print(f"last {a.show} launches of the last replay (us from the first wait return):")
    base = last[0][0]
    for i, (t1, t0, label) in enumerate(last[-a.show:]):
        j = len(last) - a.show + i
        nxt = last[j + 1][0] if j + 1 < len(last) else None
        dt = f"{(nxt - t1) / 1e3:7.2f}" if nxt is not None else "      -"
        print(f"  {label[:66]:66s} wait {(t0 - base) / 1e3:9.2f} -> {(t1 - base) / 1e3:9.2f} "
              f"(+{dt})")


if __name__ == "__main__":
    main()
