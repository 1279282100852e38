"""Time the batch-1 decode GEMVs of the qwen3-8b shape on the GPU, inside a replayed CUDA graph
(what decode runs), for every setting of ``ATLAS_CUDA_GEMV_CHUNKS`` / ``ATLAS_CUDA_FUSE_GATE_UP``.

Each graph runs one op over enough distinct weight copies that L2 (50 MB on an H200) cannot
hold them, so every launch streams its weight from HBM; the time per launch includes the gap
between graph nodes, as in a real step. GB/s = weight bytes / time per launch."""

from __future__ import annotations

import os
import statistics

HIDDEN, INTER, QKV, VOCAB = 4096, 12288, 6144, 151936
#: name -> (rows N, K) of the weight.
SHAPES = {"qkv": (QKV, HIDDEN), "o_proj": (HIDDEN, HIDDEN), "gate_up": (2 * INTER, HIDDEN),
          "down": (HIDDEN, INTER), "lm_head": (VOCAB, HIDDEN)}


def per_launch_us(be, fn, launches: int, reps: int = 5) -> float:
    be.reset_workspace()
    graph = be.capture(fn)
    graph.replay()
    times = []
    for _ in range(reps):
        a = be.event()
        graph.replay()
        b = be.event()
        times.append(be.elapsed_ms(a, b) * 1e3 / launches)
    return statistics.median(times)


def main() -> None:
    from atlas_cuda.backend import CudaBackend
    from atlas_core.ops._dtypes import bfloat16
    be = CudaBackend()
    ops = be.ops
    xs = {k: be.empty((1, k), bfloat16) for k in (HIDDEN, INTER)}
    for k, x in xs.items():
        be.fill_random(x, k, 1.0)
    print("op | N x K | MB | setting | us per launch | GB/s")
    for name, (n, k) in SHAPES.items():
        nbytes = n * k * 2
        copies = max(2, -(-400_000_000 // nbytes))
        ws = [be.empty((n, k), bfloat16) for _ in range(copies)]
        for i, w in enumerate(ws):
            be.fill_random(w, 100 + i, k ** -0.5)
        launches = copies * max(1, 32 // copies)
        settings = [("chunks=4", {"ATLAS_CUDA_GEMV_CHUNKS": "4"}),
                    ("chunks=8", {"ATLAS_CUDA_GEMV_CHUNKS": "8"})]
        if name == "gate_up":
            settings += [("linear+silu", {"ATLAS_CUDA_GEMV_CHUNKS": "4", "ATLAS_CUDA_FUSE_GATE_UP": "0"}),
                         ("fused act", {"ATLAS_CUDA_FUSE_GATE_UP": "1"})]
        for label, env in settings:
            os.environ.update(env)
            if label in ("linear+silu", "fused act"):
                fn = lambda: [ops.linear_act_and_mul(xs[k], ws[i % copies]) for i in range(launches)]
            else:
                fn = lambda: [ops.linear(xs[k], ws[i % copies]) for i in range(launches)]
            us = per_launch_us(be, fn, launches)
            print(f"{name} | {n} x {k} | {nbytes / 1e6:,.1f} | {label} | {us:.2f} | "
                  f"{nbytes / us / 1e3:,.0f}", flush=True)
            for key in env:
                os.environ.pop(key, None)
        del ws
        be.synchronize()
    print("copy bandwidth reference: see the bench's copy probe in the same run")


if __name__ == "__main__":
    main()
