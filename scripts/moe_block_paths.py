"""Time ``moe_block`` on the GPU at the MoE bench models' shapes with random weights: the
separate ops (``unfused``: kernel policy ``moe_fused=0``) and the fused kernels (``fused``:
``moe_fused=1``; ``moe_block.cu`` for one token, ``moe_decode.cu`` for more), and the
post-attention norm with it: ``norm+fused`` (``rms_norm`` then the fused ``moe_block``) against
``fold`` (``rms_norm_moe_block`` under the default policy). (The one-token ``moe_decode.cu``
path and the unfolded norm this once compared lost and are gone: docs/benchmarks.md.)
``python3 scripts/moe_block_paths.py [modes]``.

Bytes counted: router, the distinct experts the tokens chose and the shared expert, read once."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
from atlas_core.bench.graph_timing import graph_ms

#: name: (hidden, expert intermediate, experts, top-k, shared intermediate)
SHAPES = {"qwen3-30b-a3b": (2048, 768, 128, 8, 0), "qwen3.5-35b-a3b": (2048, 512, 256, 8, 512)}
#: mode: the kernel policy's ``moe_fused`` it runs under (None: the backend's own)
MODES = {"unfused": "0", "fused": "1", "norm+fused": "1", "fold": None}


def time_ms(be, fn, reps: int = 200) -> float:
    """Median of ``reps`` event-timed replays of ``fn`` captured as a CUDA graph."""
    return graph_ms(be, fn, reps)


def _block_fn(be, mode, x, res, nw, k, w):
    from atlas_core.ops.moe import compose_rms_norm_moe_block
    if mode == "norm+fused":
        return lambda: compose_rms_norm_moe_block(be.ops, x, res, nw, 1e-6, False, top_k=k,
                                                  renormalize=True, **w)
    if mode == "fold":
        return lambda: be.ops.rms_norm_moe_block(x, res, nw, 1e-6, False, top_k=k,
                                                 renormalize=True, **w)
    return lambda: be.ops.moe_block(x, top_k=k, renormalize=True, **w)


def main() -> None:
    from atlas_cuda.backend import CudaBackend
    from atlas_core.ops._dtypes import bfloat16
    be = CudaBackend()
    base = be.policy
    modes = sys.argv[1:] or list(MODES)
    print("shape | tokens | experts touched | path | us (graph replay) | GB/s")
    for name, (hidden, inter, experts, k, shared) in SHAPES.items():
        shapes = {"router_weight": (experts, hidden), "w_gate_up": (experts, 2 * inter, hidden),
                  "w_down": (experts, hidden, inter)}
        if shared:
            shapes.update(shared_gate_up=(2 * shared, hidden), shared_down=(hidden, shared),
                          shared_gate=(1, hidden))
        w = {n: be.empty(s, bfloat16) for n, s in shapes.items()}
        for i, (n, a) in enumerate(w.items()):
            be.fill_random(a, i + 1, a.shape[-1] ** -0.5)
        nw = be.empty((hidden,), bfloat16)
        be.fill_random(nw, 7, 0.1, 1.0)
        for tokens in (1, 2, 8):
            x, res = be.empty((tokens, hidden), bfloat16), be.empty((tokens, hidden), bfloat16)
            be.fill_random(x, 9, 1.0)
            be.fill_random(res, 10, 1.0)
            be.reset_workspace()
            _, ids = be.ops.moe_route(be.ops.linear(x, w["router_weight"]), k, True)
            touched = len(np.unique(be.to_host(ids)))
            nbytes = 2 * hidden * (experts + 1 + 3 * (touched * inter + shared))
            for mode in modes:
                fused = MODES[mode]
                be.set_policy(base if fused is None
                              else dataclasses.replace(base, moe_fused=fused))
                ms = time_ms(be, _block_fn(be, mode, x, res, nw, k, w))
                print(f"{name} | {tokens} | {touched} | {mode} | {ms * 1e3:.1f} | "
                      f"{nbytes / ms / 1e6:,.0f}", flush=True)
    be.set_policy(base)


if __name__ == "__main__":
    main()
