"""The grouped tensor-core GEMM path of ``moe_experts`` (``kernels/cuda/common/moe.cu``), for
batches whose (token, expert) pairs average at least two per expert."""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_cuda.array import DeviceArray
from atlas_cuda.kernels_loader import variant_of


def use_grouped(pairs: int, experts: int, dtype: Any, mode: str) -> bool:
    """Grouped GEMM once the pairs average two per expert (bf16/f16 only): below that the
    per-pair GEMV streams the weights faster (H200: 35B-A3B shape, 32 tokens, 0.39 ms GEMV
    against 0.48 ms grouped; 30B-A3B, 32 tokens: 0.57 against 0.47). ``mode``: the policy's
    ``moe`` (``grouped`` / ``gemv`` force a path)."""
    if variant_of(dtype) == "f32" or mode == "gemv" or experts > 1024:
        return False
    return mode == "grouped" or pairs >= 2 * experts


def grouped_experts(ctx: Any, out: DeviceArray, x: DeviceArray, w_gate_up: DeviceArray,
                    w_down: DeviceArray, topk_weights: DeviceArray, topk_ids: DeviceArray,
                    gelu: int) -> None:
    """Pairs sorted by expert into tiles of ``bm`` rows (static sizes: graph-capturable);
    one tensor-core tile per (expert tile, column tile) for gate_up and for down; ``ctx``: the
    backend's :class:`~atlas_cuda.context.OpContext`. Pairs of weight 0 (expert parallelism:
    another rank's expert, id 0) are left out of the tiles and of the combine, so they add no
    rows to expert 0."""
    t, hidden = x.shape
    experts, inter, k = w_down.shape[0], w_down.shape[-1], topk_ids.shape[-1]
    pairs = t * k
    bm = 64 if pairs >= 32 * min(experts, pairs) else 16
    tiles = -(-pairs // bm) + min(experts, pairs)
    sorted_ids = ctx.out((tiles * bm,), np.int32)
    tile_expert = ctx.out((tiles,), np.int32)
    ctx.launch(ctx.kernel("moe", x.dtype, "moe_align"), 1, 1024, sorted_ids, tile_expert,
               topk_ids, topk_weights, pairs, experts, bm, tiles)
    v = variant_of(x.dtype)
    threads = 128 if bm == 16 else 256
    shmem = (4 if bm == 16 else 3) * (bm + 128) * 40 * x.dtype.itemsize
    h = ctx.out((pairs, inter), x.dtype)
    kern = ctx.kernels.kernel("moe", v, f"moe_gemm_gate_up_{v}_{bm}", shmem)
    ctx.launch(kern, (-(-inter // 64), tiles), threads, h, x, w_gate_up, sorted_ids,
               tile_expert, k, inter, hidden, gelu, shmem=shmem)
    y = ctx.out((pairs, hidden), x.dtype)
    kern = ctx.kernels.kernel("moe", v, f"moe_gemm_down_{v}_{bm}", shmem)
    ctx.launch(kern, (-(-hidden // 128), tiles), threads, y, h, w_down, sorted_ids,
               tile_expert, hidden, inter, shmem=shmem)
    ctx.launch(ctx.kernel("moe", x.dtype, "moe_combine"), (-(-hidden // 2048), t), 256,
               out, y, topk_weights, k, hidden)
