"""Decode-size bf16 linears on one GPU (#21): ``qskinny_dense`` (policy ``gemm=skinny``: the
register ring at each depth, and the shared-memory ring form ``qskinny2_dense``) beside
cuBLASLt (policy ``gemm=auto`` with nvmath-python installed) and the own mma.sync GEMM
(``gemm=mma``), on qwen3-8b's four projections, 1 to 32 rows.

  python3 scripts/dense_skinny_bench.py [--layers 4] [--rows 1,2,4,8,16,32]

First checks ``qskinny_dense`` against the NumPy reference on an odd shape at every row count
and depth, then times a CUDA graph of ``--layers`` copies of the projections (qkv 6144x4096,
o 4096x4096, gate_up 24576x4096, down 4096x12288: 386 MB of bf16 a layer, more than L2 holds).
Bytes per layer: the weights (x and y are negligible); FLOPs 2 * rows * 193 M a layer. Floor:
bytes / 4.25 TB/s (H200 measured copy rate, docs/benchmarks.md). One row takes the GEMV under
every policy (the control). The best form per n-tile count is what the ``"dense"`` entries of
ops_quant.SKINNY_DEPTH / SKINNY2_CONFIG should say."""

from __future__ import annotations

import argparse

import numpy as np

from atlas_core.api import bfloat16
from atlas_core.api import reference as ref
from atlas_cuda import ops_quant
from atlas_cuda.backend import CudaBackend
from atlas_cuda.policy import KernelPolicy
from quant_skinny_bench import time_graph  # scripts/ is on sys.path when run as a script

FLOOR_BPS = 4.25e12
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
DEPTHS = (1, 2)
#: (MT, D) of the shared-memory ring form (qskinny2_dense) the default build instantiates.
RING = ((1, 3), (1, 4))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--rows", default="1,2,4,8,16,32")
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    be = CudaBackend(policy=KernelPolicy())
    rng = np.random.default_rng(0)
    ws = []
    for li in range(args.layers):
        layer = []
        for name, (n, k) in SHAPES.items():
            w = be.empty((n, k), bfloat16)
            be.fill_random(w, 100 * li + len(layer), k ** -0.5)
            layer.append(w)
        ws.append(layer)
    floor_us = sum(2 * n * k for n, k in SHAPES.values()) / FLOOR_BPS * 1e6
    lt = be.ctx.cublaslt() is not None
    print(f"floor {floor_us:.1f} us a layer; cuBLASLt {'present' if lt else 'absent'}")
    wo = (rng.standard_normal((200, 1280)) * 0.03).astype(bfloat16)
    bo = rng.standard_normal(200).astype(bfloat16)
    base_depth = dict(ops_quant.SKINNY_DEPTH)
    print(f"{'rows':>4s} {'policy':>10s} {'us/layer':>9s} {'% floor':>8s}  check")
    for m in rows:
        nt = next(t for t in (1, 2, 4) if 8 * t >= m)
        xs = {s: be.from_host(rng.standard_normal((m, SHAPES[s][1])).astype(bfloat16))
              for s in SHAPES}
        x = rng.standard_normal((m, 1280)).astype(bfloat16)
        want = np.asarray(ref.linear(x, wo, bo), np.float32)
        runs = ([("auto", None), ("mma", None)] + [("skinny", d) for d in DEPTHS]
                + [("skinny", ring) for ring in RING])
        for gemm, depth in runs:
            be.set_policy(KernelPolicy(gemm=gemm))
            if isinstance(depth, tuple):
                ops_quant.SKINNY2_CONFIG[("dense", nt)] = depth
            elif depth is not None:
                ops_quant.SKINNY_DEPTH[("dense", nt)] = depth
            y = np.asarray(be.to_host(be.ops.linear(be.from_host(x), be.from_host(wo),
                                                     be.from_host(bo))), np.float32)
            err = float(np.abs(y - want).max() / (np.abs(want).max() + 1e-9))

            def fn():
                return [be.ops.linear(xs[s], w) for layer in ws for s, w in zip(SHAPES, layer)]
            us = time_graph(be, fn) * 1e3 / args.layers
            tag = (gemm if depth is None else f"ring m{depth[0]}d{depth[1]}"
                   if isinstance(depth, tuple) else f"skinny d{depth}")
            print(f"{m:4d} {tag:>10s} {us:9.1f} {100 * floor_us / us:7.1f}%  "
                  f"{'ok' if err < 1e-2 else 'WRONG'} {err:.1e}")
            ops_quant.SKINNY_DEPTH.clear()
            ops_quant.SKINNY_DEPTH.update(base_depth)
            ops_quant.SKINNY2_CONFIG.pop(("dense", nt), None)


if __name__ == "__main__":
    main()
