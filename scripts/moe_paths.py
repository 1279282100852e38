"""Time ``moe_experts`` on the GPU, per-pair GEMV against the grouped GEMM, for the expert
shapes of the MoE bench models (run by ``scripts/gpu_check.sh moe``).

Bytes counted: the distinct experts the step touches, read once (the floor for any path)."""

from __future__ import annotations

import dataclasses
import statistics

import numpy as np

SHAPES = {"qwen3-30b-a3b": (2048, 768, 128, 8), "qwen3.5-35b-a3b": (2048, 512, 256, 8)}


def time_ms(be, fn, reps):
    fn()
    be.synchronize()
    times = []
    for _ in range(reps):
        be.reset_workspace()
        a = be.event()
        fn()
        b = be.event()
        times.append(be.elapsed_ms(a, b))
    return statistics.median(times)


def main() -> None:
    from atlas_cuda.backend import CudaBackend
    from atlas_core.ops._dtypes import bfloat16
    be = CudaBackend()
    base = be.policy
    print("shape | tokens | experts touched | mode | ms | GB/s of touched weights")
    for name, (hidden, inter, experts, k) in SHAPES.items():
        gu, dn = be.empty((experts, 2 * inter, hidden), bfloat16), be.empty((experts, hidden, inter), bfloat16)
        be.fill_random(gu, 1, hidden ** -0.5)
        be.fill_random(dn, 2, inter ** -0.5)
        for tokens in (1, 8, 32, 4096):
            x, logits = be.empty((tokens, hidden), bfloat16), be.empty((tokens, experts), bfloat16)
            be.fill_random(x, 3, 1.0)
            be.fill_random(logits, 4, 1.0)
            be.reset_workspace()
            w_ws, ids_ws = be.ops.moe_route(logits, k, True)
            w, ids = be.empty(w_ws.shape, np.float32), be.empty(ids_ws.shape, np.int32)
            be.copy_(w, w_ws)
            be.copy_(ids, ids_ws)
            touched = len(np.unique(be.to_host(ids)))
            nbytes = touched * 3 * hidden * inter * 2
            for mode in ("gemv", "grouped"):
                be.set_policy(dataclasses.replace(base, moe=mode))
                reps = 5 if tokens > 1000 else 50
                ms = time_ms(be, lambda: be.ops.moe_experts(x, gu, dn, w, ids), reps)
                print(f"{name} | {tokens} | {touched} | {mode} | {ms:.3f} | {nbytes / ms / 1e6:,.0f}")
        be.set_policy(base)


if __name__ == "__main__":
    main()
