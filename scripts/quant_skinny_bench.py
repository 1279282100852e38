"""Decode-size quantized linears on one GPU (#22 / #21): the skinny kernel (policy quant_kernel
auto) beside the legacy GEMV / skinny GEMM, qwen3-8b's projections, 1 to 64 rows.

  python3 scripts/quant_skinny_bench.py [--layers 4] [--rows 1,2,4,8,16,32,64]

First checks every kernel against the NumPy reference (random weights, rows 1..64, both
policies), then times a CUDA graph of ``--layers`` copies of qwen3-8b's four projections
(qkv 6144x4096, o 4096x4096, gate_up 24576x4096, down 4096x12288; more than L2 holds) per format,
rows and policy. Bytes to move per layer: the quantized weight + its scales (x and y are
negligible); FLOPs 2 * rows * N * K. The floor is bytes / 4.25 TB/s (H200 measured copy rate,
docs/benchmarks.md)."""

from __future__ import annotations

import argparse

import numpy as np

from atlas_core.api import QuantizedWeight, bfloat16, quantize
from atlas_core.api import reference as ref
from atlas_core.bench.random_model import empty_quantized, fill_random_quantized
from atlas_cuda.backend import CudaBackend
from atlas_cuda.policy import KernelPolicy

FLOOR_BPS = 4.25e12
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
FORMATS = {"fp8_block": (128, 128), "nvfp4": (1, 16)}


def upload(be, q: QuantizedWeight) -> QuantizedWeight:
    return q.replace(**{k: be.from_host(np.asarray(getattr(q, k), order="C"))
                        for k in ("data", "scale", "global_scale") if getattr(q, k) is not None})


def device_weight(be, fmt: str, n: int, k: int, seed: int) -> QuantizedWeight:
    w = empty_quantized(be, fmt, FORMATS[fmt], (n, k), bfloat16)
    fill_random_quantized(be, w, seed, k ** -0.5)
    return w


def nbytes(w: QuantizedWeight) -> int:
    return sum(a.nbytes for a in (w.data, w.scale, w.global_scale) if a is not None)


def check(backends, rng) -> bool:
    ok = True
    for fmt in ("fp8_block", "fp8_channel", "fp8_tensor", "nvfp4"):
        for m, n, k in ((1, 272, 1024), (3, 64, 4096), (8, 128, 384), (9, 48, 512),
                        (33, 200, 1280), (64, 96, 2048)):
            q = quantize(rng.standard_normal((n, k)).astype(np.float32) * k ** -0.5, fmt,
                         dtype=bfloat16)
            x = rng.standard_normal((m, k)).astype(bfloat16)
            b = rng.standard_normal(n).astype(bfloat16)
            want = np.asarray(ref.linear(x, q, b), np.float32)
            for name, be in backends.items():
                y = be.to_host(be.ops.linear(be.from_host(x), upload(be, q), be.from_host(b)))
                err = float(np.abs(np.asarray(y, np.float32) - want).max()
                            / (np.abs(want).max() + 1e-9))
                good = err < 1e-2
                ok &= good
                if not good or m in (1, 64):
                    print(f"check {fmt:11s} m={m:2d} n={n:4d} k={k:5d} {name:7s} "
                          f"max rel err {err:.2e} {'ok' if good else 'FAIL'}")
    return ok


def time_graph(be, fn, reps: int = 20) -> float:
    g = be.capture(fn)
    for _ in range(3):
        g.replay()
    a = be.event()
    for _ in range(reps):
        g.replay()
    b = be.event()
    return be.elapsed_ms(a, b) / reps


def sweep(rows: list[int], layers: int, depths: tuple[int, ...] = (3, 4, 6, 8)) -> None:
    """Every (weight tiles a warp MT, ring depth D) of ``qskinny2_*`` (the build with
    QSKINNY_SWEEP), and the register-ring ``qskinny_*`` ("v1"), per format and rows: checked
    against NumPy on an odd shape, then timed on qwen3-8b's projections. Prints the best
    configuration per (format, n-tiles): the values for ops_quant.SKINNY2_CONFIG."""
    from atlas_cuda import ops_quant
    be = CudaBackend(policy=KernelPolicy(quant_kernel="skinny", quant_weights=True))
    rng = np.random.default_rng(1)
    configs = [None] + [(mt, d) for mt in (1, 2) for d in depths]
    base = dict(ops_quant.SKINNY2_CONFIG)
    for fmt in FORMATS:
        kfmt = "nvfp4" if fmt == "nvfp4" else "fp8"
        ws = [[device_weight(be, fmt, *SHAPES[s], 1000 * li + i) for i, s in enumerate(SHAPES)]
              for li in range(layers)]
        floor_ms = sum(nbytes(w) for layer in ws for w in layer) / FLOOR_BPS * 1e3
        q = quantize(rng.standard_normal((200, 1280)).astype(np.float32) * 0.03, fmt,
                     dtype=bfloat16)
        qd = upload(be, q)
        for m in rows:
            nt = next(t for t in (1, 2, 4, 8) if 8 * t >= m)
            x = rng.standard_normal((m, 1280)).astype(bfloat16)
            want = np.asarray(ref.linear(x, q), np.float32)
            xs = {s: be.from_host(rng.standard_normal((m, SHAPES[s][1])).astype(bfloat16))
                  for s in SHAPES}
            best = None
            for cfg in configs:
                if cfg is None:
                    ops_quant.SKINNY2_CONFIG.pop((kfmt, nt), None)
                else:
                    ops_quant.SKINNY2_CONFIG[(kfmt, nt)] = cfg
                try:
                    y = be.to_host(be.ops.linear(be.from_host(x), qd))
                    err = float(np.abs(np.asarray(y, np.float32) - want).max()
                                / (np.abs(want).max() + 1e-9))

                    def fn(be=be):
                        return [be.ops.linear(xs[s], w) for layer in ws
                                for s, w in zip(SHAPES, layer)]
                    us = time_graph(be, fn) * 1e3 / layers
                except Exception as e:  # noqa: BLE001 - a config that cannot launch
                    print(f"sweep {fmt:9s} rows {m:2d} {str(cfg):8s} FAILED {type(e).__name__}: {e}")
                    continue
                ok = err < 1e-2
                pct = 100 * floor_ms * 1e3 / layers / us
                print(f"sweep {fmt:9s} rows {m:2d} {'v1' if cfg is None else str(cfg):8s} "
                      f"{us:8.1f} us {pct:5.1f}%  err {err:.1e}{'' if ok else ' WRONG'}")
                if ok and cfg is not None and (best is None or us < best[0]):
                    best = (us, cfg)
            print(f"best {fmt} rows {m} n{nt}: {best}")
            ops_quant.SKINNY2_CONFIG.clear()
            ops_quant.SKINNY2_CONFIG.update(base)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--rows", default="1,2,4,8,16,32,64")
    p.add_argument("--sweep", action="store_true",
                   help="time every qskinny2 configuration (builds with QSKINNY_SWEEP)")
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if args.sweep:
        from atlas_cuda.compiler import add_define
        add_define("QSKINNY_SWEEP")
        sweep(rows, args.layers)
        return
    backends = {"skinny": CudaBackend(policy=KernelPolicy(quant_kernel="skinny",
                                                          quant_weights=True)),
                "legacy": CudaBackend(policy=KernelPolicy(quant_kernel="legacy",
                                                          quant_weights=True))}
    rng = np.random.default_rng(0)
    print("correct:", check(backends, rng))
    be0 = backends["skinny"]
    dense = []
    for li in range(args.layers):
        layer = []
        for s in SHAPES:
            w = be0.empty(SHAPES[s], bfloat16)
            be0.fill_random(w, 7 + li, SHAPES[s][1] ** -0.5)
            layer.append(w)
        dense.append(layer)
    bf16_us: dict[int, float] = {}
    print("bf16 column: the dense bf16 weights of the same shapes as served today (% of their "
          "own floor); the others: % of the quantized floor")
    print(f"{'format':9s} {'rows':>4s} " + " ".join(
        f"{n:>22s}" for n in ("bf16", *backends))
          + "   bytes/layer  floor_us")
    for fmt in FORMATS:
        ws = [[device_weight(be0, fmt, *SHAPES[s], 1000 * li + i) for i, s in enumerate(SHAPES)]
              for li in range(args.layers)]
        total = sum(nbytes(w) for layer in ws for w in layer)
        floor_ms = total / FLOOR_BPS * 1e3
        for m in rows:
            xs = {s: be0.from_host(rng.standard_normal((m, SHAPES[s][1])).astype(bfloat16))
                  for s in SHAPES}
            cells = []
            if fmt == "fp8_block":  # the bf16 dense weights of the same shapes, as served today
                def dense_fn(be=be0):
                    return [be.ops.linear(xs[s], w) for layer in dense for s, w in zip(SHAPES, layer)]
                ms = time_graph(be0, dense_fn)
                bf16_us[m] = ms * 1e3 / args.layers
            dense_floor_us = sum(2 * n * k for n, k in SHAPES.values()) / FLOOR_BPS * 1e6
            cells.append(f"{bf16_us[m]:8.1f} us {100 * dense_floor_us / bf16_us[m]:5.1f}%")
            for name, be in backends.items():
                def fn(be=be):
                    return [be.ops.linear(xs[s], w) for layer in ws for s, w in zip(SHAPES, layer)]
                ms = time_graph(be, fn)
                cells.append(f"{ms * 1e3 / args.layers:8.1f} us {100 * floor_ms / ms:5.1f}%")
            print(f"{fmt:9s} {m:4d} " + " ".join(f"{c:>22s}" for c in cells)
                  + f"   {total / args.layers / 1e6:8.1f} MB {floor_ms * 1e3 / args.layers:7.1f}")


if __name__ == "__main__":
    main()
