"""Batch-1 decode GEMV tiles and pipeline depth, chained as in a decode step (qwen3-8b shapes).

32 dependent PDL launches per CUDA graph over weight copies L2 cannot hold: the production
``gemvn`` kernel at its tile (G columns per warp, S warps splitting K) against ``gemvd``, the
same tile with NB weight stages in flight per warp. Prints us per launch, GB/s, and checks each
``gemvd`` output against ``gemvn``'s.

    python scripts/boundary_probe.py
"""

from __future__ import annotations

from atlas_core.bench.graph_timing import graph_ms

#: name -> (N, K, tiles (G, S) to try); the first tile is what ``ops_gemv.gemv_tile`` picks.
SHAPES = {"o_proj": (4096, 4096, [(4, 1), (4, 2), (2, 2), (2, 1), (1, 2), (4, 4)]),
          "qkv": (6144, 4096, [(1, 2), (4, 1), (4, 2), (2, 2), (2, 1)]),
          "down": (4096, 12288, [(1, 4), (4, 4), (2, 4), (4, 2), (1, 8), (2, 8)]),
          "gate_up": (24576, 4096, [(1, 2), (2, 2), (4, 2), (2, 1)])}
LAUNCHES = 32


def main() -> None:
    import numpy as np
    from atlas_cuda.backend import CudaBackend
    from atlas_core.ops._dtypes import bfloat16
    be = CudaBackend()
    kl = be.kernels
    print("op | MB | kernel | us per launch | GB/s")
    for name, (n, k, tiles) in SHAPES.items():
        nbytes = n * k * 2
        copies = max(2, -(-400_000_000 // nbytes))
        ws = [be.empty((n, k), bfloat16) for _ in range(copies)]
        for i, w in enumerate(ws):
            be.fill_random(w, 100 + i, k ** -0.5)
        x = be.empty((1, k), bfloat16)
        be.fill_random(x, 1, 1.0)
        y = be.empty((1, n), bfloat16)
        for g, s in tiles:
            grid = -(-n // (8 // s * g))
            prod = kl.kernel("gemv_norm", "bf16", f"gemvn_bf16_m1_g{g}")
            runs = [("gemvn", lambda w: kl.launch(prod, grid, 256, y, x, w, None, 1, n, k, 0, s,
                                                  0, pdl=True))]
            for nb in (2, 3, 4):
                kd = kl.kernel("gemv_norm", "bf16", f"gemvd_bf16_g{g}_b{nb}")
                runs.append((f"gemvd nb{nb}", lambda w, kd=kd: kl.launch(
                    kd, grid, 256, y, x, w, n, k, s, pdl=True)))
            ref = None
            for label, fn in runs:
                fn(ws[0])
                out = be.to_host(y).astype(np.float32)
                ref = out if ref is None else ref
                err = float(abs(out - ref).max())
                us = graph_ms(be, lambda: [fn(ws[i % copies]) for i in range(LAUNCHES)],
                              20) * 1e3 / LAUNCHES
                print(f"{name} | {nbytes / 1e6:.1f} | g{g}s{s} {label} | {us:.2f} | "
                      f"{nbytes / us / 1e3:,.0f}" + (f" | max err {err:.3g}" if err else ""),
                      flush=True)
        del ws
        be.synchronize()


if __name__ == "__main__":
    main()
