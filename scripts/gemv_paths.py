"""Time the batch-1 decode GEMVs of the qwen3-8b shape on the GPU, inside a replayed CUDA graph
(what decode runs): ``linear`` on every kernel policy ``gemv_tile`` (``ATLAS_CUDA_GEMV_TILE``) and
``rms_norm_linear`` fused (per tile) against its composition, ``rms_norm`` then ``linear`` (then
``silu_and_mul`` for gate_up).

Each graph runs one op over enough distinct weight copies that L2 (50 MB on an H200) cannot
hold them, so every launch streams its weight from HBM; the time per launch includes the gap
between graph nodes, as in a real step. GB/s = weight bytes / time per launch.

    python scripts/gemv_paths.py [--quick] [--moe]
"""

from __future__ import annotations

import dataclasses
import sys

from atlas_core.bench.graph_timing import graph_ms

HIDDEN, INTER, QKV, VOCAB = 4096, 12288, 6144, 151936
#: name -> (rows N, K) of the weight.
SHAPES = {"qkv": (QKV, HIDDEN), "o_proj": (HIDDEN, HIDDEN), "gate_up": (2 * INTER, HIDDEN),
          "down": (HIDDEN, INTER), "lm_head": (VOCAB, HIDDEN)}
#: ``--moe``: the attention-side GEMVs of qwen3-30b-a3b and qwen3.5-35b-a3b (hidden 2048).
MOE_SHAPES = {"qkv": (5120, 2048), "qkv_gated": (9216, 2048), "gdn_in_proj": (12352, 2048),
              "o_proj": (2048, 4096)}
TILES = ["g1s1", "g2s1", "g4s1", "g1s2", "g2s2", "g4s2", "g1s4", "g4s4", "auto"]
NORM_TILES = ["g1s1", "g2s1", "g1s2", "g2s2", "g4s1", "g4s2", "g4s4", "auto"]


def per_launch_us(be, fn, launches: int, reps: int = 7) -> float:
    be.reset_workspace()
    return graph_ms(be, fn, reps) * 1e3 / launches


def weights(be, n: int, k: int):
    from atlas_core.ops._dtypes import bfloat16
    nbytes = n * k * 2
    copies = max(2, -(-400_000_000 // nbytes))
    ws = [be.empty((n, k), bfloat16) for _ in range(copies)]
    for i, w in enumerate(ws):
        be.fill_random(w, 100 + i, k ** -0.5)
    return ws, copies * max(1, 32 // copies)


def run(be, label: str, tile: str, fn, launches: int, name: str, n: int, k: int) -> None:
    """Time ``fn`` with the backend's policy ``gemv_tile`` set to ``tile`` for the run."""
    from atlas_cuda.policy import parse_value
    base = be.policy
    be.set_policy(dataclasses.replace(base, gemv_tile=parse_value("gemv_tile", tile, "tile")))
    try:
        us = per_launch_us(be, fn, launches)
    finally:
        be.set_policy(base)
    nbytes = n * k * 2
    print(f"{name} | {n} x {k} | {nbytes / 1e6:,.1f} | {label} | {us:.2f} | "
          f"{nbytes / us / 1e3:,.0f}", flush=True)


def main() -> None:
    from atlas_cuda.backend import CudaBackend
    from atlas_core.ops._dtypes import bfloat16
    from atlas_core.ops.norm import compose_rms_norm_linear
    quick = "--quick" in sys.argv
    shapes = MOE_SHAPES if "--moe" in sys.argv else SHAPES
    be = CudaBackend()
    ops = be.ops
    xs = {k: be.empty((1, k), bfloat16) for k in {k for _, k in shapes.values()}}
    for k, x in xs.items():
        be.fill_random(x, k, 1.0)
    res, nw = {}, {}
    for k in xs:
        res[k], nw[k] = be.empty((1, k), bfloat16), be.empty((k,), bfloat16)
        be.fill_random(res[k], 7, 1.0)
        be.fill_random(nw[k], 8, 0.1)
    print("op | N x K | MB | setting | us per launch | GB/s")
    for name, (n, k) in shapes.items():
        ws, launches = weights(be, n, k)
        x, c = xs[k], len(ws)
        for tile in (["auto"] if quick else TILES):
            run(be, f"linear {tile}", tile,
                lambda: [ops.linear(x, ws[i % c]) for i in range(launches)], launches, name, n, k)
        if name in ("qkv", "gate_up", "qkv_gated", "gdn_in_proj"):
            act = "silu" if name == "gate_up" else None
            norm = lambda: [ops.rms_norm_linear(x, res[k], nw[k], 1e-6, ws[i % c], None, False,
                                                act)
                            for i in range(launches)]
            composed = lambda: [compose_rms_norm_linear(ops, x, res[k], nw[k], 1e-6, ws[i % c],
                                                        None, False, act)
                                for i in range(launches)]
            run(be, "rms_norm then linear", "auto", composed, launches, name, n, k)
            for tile in (["auto"] if quick else NORM_TILES):
                run(be, f"norm fused {tile}", tile, norm, launches, name, n, k)
        del ws
        be.synchronize()


if __name__ == "__main__":
    main()
