"""Gemma-4 prefill attention per op on the GPU: ``sliding_window_attention`` over one chunk of
``CHUNK`` query tokens after ``ctx`` cached ones (the engine's chunked prefill of a long prompt),
at the full layers (head dim 512, window 0) and the sliding ones (256, window 1,024) of
gemma-4-26b-a4b and gemma-4-31b, on the tensor-core tile kernels (``swa_mma``, the default, and
``swa_fa``, ``ATLAS_GEMMA_PREFILL_ATTENTION=fa``: K/V through a cp.async ring). Each op is
captured ``REPS`` times in one CUDA graph and event-timed (``graph_ms``). Reported: ms, the
causal FLOPs (QK and PV: 4 x head dim x query heads x the keys each query sees) as TFLOP/s,
and the K/V bytes the blocks read (every block streams its span; a z-split of 512-wide heads
reads K twice) against the cache's size. Session 24 found 32k-token prompts prefilling at 8,025
(26b) and 2,155 (31b) tok/s, against 19,291 / 7,470 at 1k: this bench says what the full layers
cost and how far from the tensor cores' rate they run.

    python scripts/gemma_prefill_bench.py
"""

from __future__ import annotations

import numpy as np
from atlas_core.bench.graph_timing import graph_ms

#: name: (query heads, kv heads, head dim, window)
SHAPES = {"26b full": (16, 2, 512, 0), "31b full": (32, 4, 512, 0),
          "26b sliding": (16, 8, 256, 1024), "31b sliding": (32, 16, 256, 1024)}
CHUNK, BLOCK, REPS, REPLAYS = 4096, 16, 3, 10


def keys_seen(ctx: int, n: int, window: int) -> int:
    """Sum over the chunk's queries of the keys each sees."""
    pos = np.arange(ctx, ctx + n)
    first = np.maximum(0, pos - window + 1) if window else np.zeros_like(pos)
    return int((pos - first + 1).sum())


def main() -> None:
    from atlas_core.ops._dtypes import bfloat16
    from atlas_cuda.backend import CudaBackend
    from atlas_gemma4.cuda.gemma4_ops import MMA_HEADS, MMA_ROWS, Gemma4CudaOps

    be = CudaBackend()
    ops = be.ctx.bind(Gemma4CudaOps)
    print("gemma prefill | shape | ctx + chunk | swa_mma ms | TFLOP/s | swa_fa ms | TFLOP/s | "
          "K/V GB read")
    for name, (h, kh, d, window) in SHAPES.items():
        for ctx in (0, 12288, 28672):
            total = ctx + CHUNK
            width = -(-total // BLOCK)
            kc = be.empty((width, BLOCK, kh, d), bfloat16)
            vc = be.empty((width, BLOCK, kh, d), bfloat16)
            q = be.empty((CHUNK, h, d), bfloat16)
            for i, a in enumerate((kc, vc, q)):
                be.fill_random(a, 3 + i, 1.0)
            bt = be.from_host(np.arange(width, dtype=np.int32).reshape(1, width))
            sl = be.from_host(np.array([total], np.int32))
            cu = be.from_host(np.array([0, CHUNK], np.int32))
            out = be.empty(q.shape, bfloat16)
            scale = d ** -0.5

            def timed(tile) -> float:
                def op():
                    be.reset_workspace()
                    for _ in range(REPS):
                        tile(out, q, kc, vc, bt, sl, cu, scale, window)
                return graph_ms(be, op, REPLAYS) / REPS

            mma_ms, fa_ms = timed(ops._tile_mma), timed(ops._tile_fa)
            seen = keys_seen(ctx, CHUNK, window)
            flops = 4 * d * h * seen
            # blocks of MMA_ROWS (token, head) rows, hb heads of a KV head each, times the column
            # halves of a 512-wide head; each reads all of K and its half of V over the span
            group, cols = h // kh, min(d, 256)
            hb = next(n for n in MMA_HEADS if group % n == 0)
            blocks = -(-CHUNK // (MMA_ROWS // hb)) * (group // hb) * (d // cols) * kh
            kv_read = blocks * (seen / CHUNK) * 2 * (d + cols)
            print(f"gemma prefill | {name} | {ctx} + {CHUNK} | {mma_ms:.2f} | "
                  f"{flops / mma_ms / 1e9:,.1f} | {fa_ms:.2f} | {flops / fa_ms / 1e9:,.1f} | "
                  f"{kv_read / 1e9:.1f}")
            del kc, vc, q, out


if __name__ == "__main__":
    main()
