"""Where the time goes inside one kernel of a batch-1 decode step, in the replayed graph.

Kernels mark phases with ``profile_stamp(i)`` (common.cuh): in a build with
``ATLAS_CUDA_NVRTC_DEFINES=ATLAS_PROFILE`` thread 0 of every block writes the global timer into
slot i of its row of the module's ``atlas_profile`` array (a no-op otherwise). This script
builds the bench model with that define (a separate kernel-cache entry), replays the decode
graph, reads the array after each replay (the last launch of the module in the step wins: the
last layer) and prints, per slot, when the blocks reached it relative to the first block's slot 0
(min / median / max over the blocks that reached it, median over replays), in microseconds.

    python scripts/kernel_phases.py qwen3-30b-a3b --module moe_experts1
"""

from __future__ import annotations

import argparse

import numpy as np

SLOTS, MAX_BLOCKS = 8, 2048


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--module", default="moe_experts1")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--prompt", type=int, default=128)
    a = p.parse_args()
    from atlas_cuda.compiler import add_define
    add_define("ATLAS_PROFILE")
    from atlas_core.bench.graph_timing import decode_graph, replay_ms
    from atlas_core.bench.random_model import build_random_model
    from atlas_core.bench.shapes import shape_config
    from atlas_core.engine.loading import create_backend
    from atlas_cuda.driver import check, drv
    from atlas_cuda.kernels_loader import module_global

    be, registry = create_backend("cuda")
    model = build_random_model(shape_config(a.model), be, registry)
    _engine, graph = decode_graph(model, be, a.prompt)
    print(f"{a.model}: decode graph {replay_ms(be, graph, 50):.3f} ms (profiling build)")
    mods = [m for (name, _v), m in be.kernels.modules.items() if name == a.module]
    if not mods:
        raise SystemExit(f"module {a.module} was not used by this model's decode step")
    d = drv()
    ptr = module_global(mods[0], "atlas_profile")
    if ptr is None:
        raise SystemExit(f"{a.module} has no atlas_profile array: does it include common.cuh?")
    nbytes = SLOTS * MAX_BLOCKS * 8
    host = np.zeros((MAX_BLOCKS, SLOTS), np.uint64)
    runs = []
    for _ in range(a.reps):
        be.synchronize()
        check(d.cuMemsetD8(ptr, 0, nbytes))
        graph.replay()
        be.synchronize()
        check(d.cuMemcpyDtoH(host.ctypes.data, ptr, nbytes))
        used = host[:, 0] > 0
        if not used.any():
            raise SystemExit(f"no stamps written: does {a.module} call profile_stamp()?")
        t = host[used].astype(np.int64)
        t0 = t[:, 0].min()
        runs.append([(np.nan, np.nan, np.nan, 0) if not (t[:, s] > 0).any() else
                     tuple(np.percentile((t[t[:, s] > 0, s] - t0) / 1e3, q) for q in (0, 50, 100))
                     + ((t[:, s] > 0).sum(),) for s in range(SLOTS)])
    r = np.median(np.array(runs), axis=0)
    print(f"{a.module}: {int(used.sum())} blocks, us from the first block's slot 0 "
          f"(median of {a.reps} replays)")
    print("slot      min   median      max  blocks")
    for s in range(SLOTS):
        if not np.isnan(r[s, 0]):
            print(f"{s:4d} {r[s, 0]:8.2f} {r[s, 1]:8.2f} {r[s, 2]:8.2f} {r[s, 3]:7.0f}")


if __name__ == "__main__":
    main()
