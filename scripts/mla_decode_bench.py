"""Microseconds of absorbed MLA decode attention on the GPU against the latent-KV read floor,
beside core GQA ``paged_attention`` at the same context (qwen3-8b heads) as the baseline.

Each op is captured ``REPS`` times in one CUDA graph and event-timed (as
scripts/attn_decode_bench.py does). Latent bytes: every context token's ``kv_lora_rank +
qk_rope_head_dim`` values once per sequence (q and out are negligible); the floor is those bytes
at ``--bandwidth`` (default: 4.25 TB/s on an H200, the copy bandwidth in PERF-NOTES; else
3.35 TB/s, H100 SXM HBM3).

The kernel column names the decode kernel that ran (tensor cores: ``mla_decode_keys2x2_r<rank>``,
warp pairs over the keys and the pair's warps over the output columns, two 8-warp blocks an SM,
the default at 256 + 64; ``mla_decode_keys2_r<rank>``, the same as one 16-warp block an SM,
``ATLAS_MLA_DECODE=keys2``; ``mla_decode_keys_r<rank>``, warps over the keys, ``keys1``;
``mla_decode_mma_r<rank>``, warps over the row width, ``v1``; ``mla_decode_split``: the SIMT
fallback, forced with ``ATLAS_CUDA_ATTENTION=simt``). ``--ab`` times every MLA case with each
distinct kernel of those choices in one process (the default first). TFLOP/s counts the two
latent matmuls
(``2 * heads * (2 * rank + rope)`` a key): DeepSeek-V3's 128 heads make it bound by the tensor
cores, not by the latent read.

    python scripts/mla_decode_bench.py [--bandwidth 4.25e12] [--ab]
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from atlas_core.api import Registry, bfloat16
from atlas_core.bench.graph_timing import graph_ms

#: ``ATLAS_MLA_DECODE`` values ``--ab`` times after the default
AB_CHOICES = ("keys2", "keys1", "v1")
#: name: (query heads, kv_lora_rank, qk_rope_head_dim)
SHAPES = {"deepseek-v3": (128, 512, 64), "mistral-small-4": (32, 256, 64)}
CASES = [(b, c) for c in (1024, 32768) for b in (1, 8, 32)]
REPS, REPLAYS, BLOCK = 10, 20, 16


def per_op_us(be, fn) -> float:
    be.reset_workspace()
    return graph_ms(be, lambda: [fn() for _ in range(REPS)], REPLAYS) * 1e3 / REPS


def tables(be, batch: int, ctx: int):
    width = -(-ctx // BLOCK)
    return (be.from_host(np.arange(batch * width, dtype=np.int32).reshape(batch, width)),
            be.from_host(np.full(batch, ctx, np.int32)),
            be.from_host(np.arange(batch + 1, dtype=np.int32)), batch * width)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bandwidth", type=float, default=None)
    parser.add_argument("--ab", action="store_true",
                        help="each MLA case with the default kernel, then each other "
                             f"ATLAS_MLA_DECODE choice ({', '.join(AB_CHOICES)})")
    args = parser.parse_args()
    be = Registry().create("gpu_backends", "cuda")
    device = be.device_info().name
    if args.bandwidth is None:
        args.bandwidth = 4.25e12 if "H200" in device else 3.35e12
    print(f"{device}: floor at {args.bandwidth / 1e12:.2f} TB/s")
    print("op | kernel | shape | batch | ctx | KV MB | floor us | us | % of floor | TFLOP/s")
    envs = (os.environ.get("ATLAS_MLA_DECODE", ""), *AB_CHOICES) if args.ab else (None,)
    mla = be.ops.mla_absorbed_attention.__self__  # MlaCudaOps: names the decode kernel
    for name, (h, rank, rope) in SHAPES.items():
        for batch, ctx in CASES:
            bt, sl, cu, blocks = tables(be, batch, ctx)
            cache = be.empty((blocks, BLOCK, 1, rank + rope), bfloat16)
            q_lat, q_pe = be.empty((batch, h, rank), bfloat16), be.empty((batch, h, rope), bfloat16)
            for i, a in enumerate((cache, q_lat, q_pe)):
                be.fill_random(a, i + 1, 1.0)
            nbytes = batch * ctx * (rank + rope) * 2
            flops = 2 * batch * ctx * h * (2 * rank + rope)
            floor = nbytes / args.bandwidth * 1e6
            timed = set()
            for env in envs:
                if env is not None:
                    os.environ["ATLAS_MLA_DECODE"] = env
                kernel = mla.decode_kernel(q_lat, q_pe)
                if kernel in timed:  # a choice without this shape falls back to a timed one
                    continue
                timed.add(kernel)
                us = per_op_us(be, lambda: be.ops.mla_absorbed_attention(
                    q_lat, q_pe, cache, bt, sl, cu, (rank + rope) ** -0.5))
                print(f"mla_absorbed_attention | {kernel} | "
                      f"{name} {h}x{rank}+{rope} | {batch} | {ctx} | "
                      f"{nbytes / 1e6:.1f} | {floor:.2f} | {us:.2f} | {100 * floor / us:.1f} | "
                      f"{flops / us / 1e6:.0f}")
            if args.ab:
                os.environ["ATLAS_MLA_DECODE"] = envs[0]
            del cache
    for batch, ctx in CASES:
        bt, sl, cu, blocks = tables(be, batch, ctx)
        kc, vc = (be.empty((blocks, BLOCK, 8, 128), bfloat16) for _ in range(2))
        q = be.empty((batch, 32, 128), bfloat16)
        for i, a in enumerate((kc, vc, q)):
            be.fill_random(a, i + 1, 1.0)
        nbytes = 2 * batch * ctx * 8 * 128 * 2
        us = per_op_us(be, lambda: be.ops.paged_attention(q, kc, vc, bt, sl, cu, 128 ** -0.5))
        floor = nbytes / args.bandwidth * 1e6
        print(f"paged_attention (baseline) | - | qwen3-8b 32/8x128 | {batch} | {ctx} | "
              f"{nbytes / 1e6:.1f} | {floor:.2f} | {us:.2f} | {100 * floor / us:.1f} | -")
        del kc, vc


if __name__ == "__main__":
    main()
