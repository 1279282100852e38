"""Time ``moe_block`` on the GPU: the separate ops (``ATLAS_CUDA_MOE_FUSED=0``) against the
fused decode kernels (``ATLAS_CUDA_MOE_DECODE``: the three-kernel ``warp`` / ``split`` paths of
``moe_decode.cu``), at the
MoE bench models' shapes with random weights. ``python3 scripts/moe_block_paths.py [modes]``.

Bytes counted: router, the distinct experts the tokens chose and the shared expert, read once."""

from __future__ import annotations

import os
import sys

import numpy as np
from atlas_core.bench.graph_timing import graph_ms

#: name: (hidden, expert intermediate, experts, top-k, shared intermediate)
SHAPES = {"qwen3-30b-a3b": (2048, 768, 128, 8, 0), "qwen3.5-35b-a3b": (2048, 512, 256, 8, 512)}


def time_ms(be, fn, reps: int = 200) -> float:
    """Median of ``reps`` event-timed replays of ``fn`` captured as a CUDA graph."""
    return graph_ms(be, fn, reps)


def main() -> None:
    from atlas_cuda.backend import CudaBackend
    from atlas_core.ops._dtypes import bfloat16
    be = CudaBackend()
    modes = sys.argv[1:] or ["unfused", "warp"]
    print("shape | tokens | experts touched | path | ms (graph replay) | GB/s")
    for name, (hidden, inter, experts, k, shared) in SHAPES.items():
        shapes = {"router_weight": (experts, hidden), "w_gate_up": (experts, 2 * inter, hidden),
                  "w_down": (experts, hidden, inter)}
        if shared:
            shapes.update(shared_gate_up=(2 * shared, hidden), shared_down=(hidden, shared),
                          shared_gate=(1, hidden))
        w = {n: be.empty(s, bfloat16) for n, s in shapes.items()}
        for i, (n, a) in enumerate(w.items()):
            be.fill_random(a, i + 1, a.shape[-1] ** -0.5)
        for tokens in (1, 2, 8):
            x = be.empty((tokens, hidden), bfloat16)
            be.fill_random(x, 9, 1.0)
            be.reset_workspace()
            _, ids = be.ops.moe_route(be.ops.linear(x, w["router_weight"]), k, True)
            touched = len(np.unique(be.to_host(ids)))
            nbytes = 2 * hidden * (experts + 1 + 3 * (touched * inter + shared))
            for mode in modes:
                os.environ["ATLAS_CUDA_MOE_FUSED"] = "0" if mode == "unfused" else "1"
                os.environ["ATLAS_CUDA_MOE_DECODE"] = "warp" if mode == "unfused" else mode
                ms = time_ms(be, lambda: be.ops.moe_block(x, top_k=k, renormalize=True, **w))
                print(f"{name} | {tokens} | {touched} | {mode} | {ms:.4f} | "
                      f"{nbytes / ms / 1e6:,.0f}")
    for var in ("ATLAS_CUDA_MOE_FUSED", "ATLAS_CUDA_MOE_DECODE"):
        os.environ.pop(var, None)


if __name__ == "__main__":
    main()
