"""Microseconds per op of decode attention, the rope prologue and sampling on the GPU, each op
captured ``REPS`` times in one CUDA graph (in-graph time, launch gaps included) and event-timed.
(The previous kernels these were A/B-timed against are gone; their numbers are in
docs/benchmarks.md.)

Attention bytes: K and V of every context token once (q and out are negligible); the floor is
those bytes at 4.2 TB/s. Block tables are as wide as the context (as in the profiled engine).

Rope + attention (``--rope-attention``: that section only): ``rope_cache_attention`` as the
rope prologue then attention (its two-op composition) against the fused kernel.

Tensor-core kernel splits (``--mma-splits``: that section only): ``attn_dec_mma_*`` at qwen3-8b
heads under forced split counts against the plan's (is the one-wave plan right at batches 2-32,
1k-8k?), and the windowed decode of gemma-4-26b-a4b's sliding layers (``window_decode``,
1,024-key window) on the mma kernel against ``attn_dec_swa_*``.

Odd GQA groups (``--odd-groups``: that section only): MiniMax-M2 (48/8), Qwen3-14B (40/8) and
Qwen2.5-7B (28/4) heads at 128 under each decode plan (tensor-core kernel with the whole group
in its tile, against the CUDA-core ``split`` / ``shared`` plans, which take 2 or 1 heads a block).

Merge kernel (``--merge``: that section only): the tensor-core decode kernel with its partials
merged by its last split block (policy ``decode_merge=block``, the default) against a kernel of
their own (``decode_merge=kernel``), at qwen3-8b / qwen3-30b-a3b / nemotron / qwen3.5-35b-a3b /
MiniMax-M2 heads.

Gemma-4 full layers (``--gemma-full``: that section only): head dim 512 on the tensor-core
kernel (plan and forced heads a block; and with policy ``decode_merge=kernel``, the whole group
a block and the partials merged by ``attn_dec_merge_*``) against atlas-gemma4's ``swa_split``.

    python scripts/attn_decode_bench.py [--precompile | --rope-attention | --mma-splits |
                                         --odd-groups | --merge | --gemma-full]
"""

from __future__ import annotations

import os
import sys

import numpy as np
from atlas_core.bench.graph_timing import graph_ms

#: name: (query heads, kv heads, head_dim)
HEADS = {"qwen3-8b": (32, 8, 128), "qwen3-30b-a3b": (32, 4, 128), "qwen3.5-35b-a3b": (16, 2, 256)}
CASES = [(1, c) for c in (128, 512, 1024, 4096, 32768)] + [(4, 1024), (8, 1024), (8, 4096)]
REPS, REPLAYS, BLOCK, FLOOR_BPS = 20, 30, 16, 4.2e12


def per_op_us(be, fn) -> float:
    """Median in-graph microseconds of one ``fn()``."""
    be.reset_workspace()
    return graph_ms(be, lambda: [fn() for _ in range(REPS)], REPLAYS) * 1e3 / REPS


def attention(be, bf16) -> None:
    print("attention | heads q/kv/d | batch | ctx | KV MB | floor us | us | GB/s")
    for name, (h, kh, d) in HEADS.items():
        for batch, ctx in CASES:
            width = -(-ctx // BLOCK)
            kc = be.empty((batch * width, BLOCK, kh, d), bf16)
            vc = be.empty((batch * width, BLOCK, kh, d), bf16)
            be.fill_random(kc, 1, 1.0)
            be.fill_random(vc, 2, 1.0)
            q = be.empty((batch, h, d), bf16)
            be.fill_random(q, 3, 1.0)
            bt = be.from_host(np.arange(batch * width, dtype=np.int32).reshape(batch, width))
            sl = be.from_host(np.full(batch, ctx, np.int32))
            cu = be.from_host(np.arange(batch + 1, dtype=np.int32))
            nbytes = 2 * batch * ctx * kh * d * 2
            new = per_op_us(be, lambda: be.ops.paged_attention(q, kc, vc, bt, sl, cu, d ** -0.5))
            print(f"{name} | {h}/{kh}/{d} | {batch} | {ctx} | {nbytes / 1e6:.1f} | "
                  f"{nbytes / FLOOR_BPS * 1e6:.2f} | {new:.2f} | {nbytes / new / 1e3:,.0f}")
            del kc, vc


def sweep(be, bf16) -> None:
    """Under other ``COMBINE_FLOATS`` caps (heads per block / splits plan)."""
    from atlas_cuda import ops_attention
    default = ops_attention.COMBINE_FLOATS
    print("sweep | heads q/kv/d | batch | ctx | combine floats | plan | us")
    for name, (h, kh, d) in HEADS.items():
        for batch, ctx in ((1, 4096), (1, 32768), (8, 4096)):
            width = -(-ctx // BLOCK)
            kc = be.empty((batch * width, BLOCK, kh, d), bf16)
            vc = be.empty((batch * width, BLOCK, kh, d), bf16)
            q = be.empty((batch, h, d), bf16)
            for a in (kc, vc, q):
                be.fill_random(a, 1, 1.0)
            bt = be.from_host(np.arange(batch * width, dtype=np.int32).reshape(batch, width))
            sl = be.from_host(np.full(batch, ctx, np.int32))
            cu = be.from_host(np.arange(batch + 1, dtype=np.int32))
            for cap in (8192, 16384, 32768, 65536):
                ops_attention.COMBINE_FLOATS = cap
                plan = ops_attention.decode_plan(batch, h, kh, d, ctx, be.num_sms)
                us = per_op_us(be, lambda: be.ops.paged_attention(q, kc, vc, bt, sl, cu,
                                                                  d ** -0.5))
                print(f"{name} | {h}/{kh}/{d} | {batch} | {ctx} | {cap} | {plan} | {us:.2f}")
            del kc, vc
    ops_attention.COMBINE_FLOATS = default


def rope(be, bf16) -> None:
    print("rope prologue | heads q/kv/d | tokens | us")
    for name, (h, kh, d) in HEADS.items():
        for t in (1, 8):
            qkv = be.empty((t, (h + 2 * kh) * d), bf16)
            be.fill_random(qkv, 4, 1.0)
            kc, vc = be.zeros((64, BLOCK, kh, d), bf16), be.zeros((64, BLOCK, kh, d), bf16)
            cs = be.from_host(np.random.default_rng(0).uniform(-1, 1, (4096, d)).astype(np.float32))
            pos = be.from_host(np.arange(100, 100 + t, dtype=np.int32))
            slots = be.from_host(np.arange(t, dtype=np.int32))
            norm_dtype = np.float32 if d == 256 else bf16
            qn, kn = be.zeros((d,), norm_dtype), be.zeros((d,), norm_dtype)
            rot = 64 if d == 256 else d
            new = per_op_us(be, lambda: be.ops.qk_norm_rope_and_cache(
                qkv, pos, cs, kc, vc, slots, num_heads=h, num_kv_heads=kh, head_dim=d,
                q_norm=qn, k_norm=kn, rotary_dim=rot))
            print(f"{name} | {h}/{kh}/{d} | {t} | {new:.2f}")


def rope_attention(be, bf16) -> None:
    """Split (rope kernel + attention) against fused ``rope_cache_attention``, qk norms on."""
    from atlas_core.ops.attention import compose_rope_cache_attention
    print("rope+attention | heads q/kv/d | batch | ctx | KV MB | floor us | split us | fused us")
    for name, (h, kh, d) in HEADS.items():
        for batch, ctx in ((1, 128), (1, 1024), (1, 4096), (8, 1024)):
            width = -(-ctx // BLOCK)
            kc = be.empty((batch * width, BLOCK, kh, d), bf16)
            vc = be.empty((batch * width, BLOCK, kh, d), bf16)
            qkv = be.empty((batch, (h + 2 * kh) * d), bf16)
            for i, a in enumerate((kc, vc, qkv)):
                be.fill_random(a, 6 + i, 1.0)
            rot = 64 if d == 256 else d
            table = np.random.default_rng(0).uniform(-1, 1, (ctx, rot)).astype(np.float32)
            cs = be.from_host(table)
            norm_dtype = np.float32 if d == 256 else bf16
            qn, kn = be.from_host(np.ones(d, norm_dtype)), be.from_host(np.ones(d, norm_dtype))
            tables = np.arange(batch * width, dtype=np.int32).reshape(batch, width)
            bt = be.from_host(tables)
            sl = be.from_host(np.full(batch, ctx, np.int32))
            pos = be.from_host(np.full(batch, ctx - 1, np.int32))
            slots = be.from_host((tables[:, (ctx - 1) // BLOCK] * BLOCK + (ctx - 1) % BLOCK)
                                 .astype(np.int32))
            cu = be.from_host(np.arange(batch + 1, dtype=np.int32))

            args = (qkv, pos, cs, kc, vc, slots, bt, sl, cu, d ** -0.5)
            kw = dict(num_heads=h, num_kv_heads=kh, head_dim=d, q_norm=qn, k_norm=kn,
                      rotary_dim=rot)
            us = {"split": per_op_us(be, lambda: compose_rope_cache_attention(be.ops, *args,
                                                                               **kw)),
                  "fused": per_op_us(be, lambda: be.ops.rope_cache_attention(*args, **kw))}
            nbytes = 2 * batch * ctx * kh * d * 2
            print(f"{name} | {h}/{kh}/{d} | {batch} | {ctx} | {nbytes / 1e6:.2f} | "
                  f"{nbytes / FLOOR_BPS * 1e6:.2f} | {us['split']:.2f} | {us['fused']:.2f}")
            del kc, vc


def _paged(be, bf16, batch, ctx, h, kh, d, table=None):
    """Paged K/V of ``batch`` sequences of ``ctx`` keys; block tables ``table`` tokens wide
    (default ``ctx``; the engine's decode graphs have the model's longest sequence, entries past
    a sequence's blocks point at block 0)."""
    width = -(-ctx // BLOCK)
    kc = be.empty((batch * width, BLOCK, kh, d), bf16)
    vc = be.empty((batch * width, BLOCK, kh, d), bf16)
    q = be.empty((batch, h, d), bf16)
    for i, a in enumerate((kc, vc, q)):
        be.fill_random(a, 7 + i, 1.0)
    tables = np.arange(batch * width, dtype=np.int32).reshape(batch, width)
    if table:
        tables = np.pad(tables, ((0, 0), (0, -(-table // BLOCK) - width)))
    bt = be.from_host(np.ascontiguousarray(tables))
    sl = be.from_host(np.full(batch, ctx, np.int32))
    cu = be.from_host(np.arange(batch + 1, dtype=np.int32))
    return q, kc, vc, bt, sl, cu


def mma_splits(be, bf16) -> None:
    """Forced split counts of the tensor-core decode kernel, and the windowed decode paths."""
    import dataclasses

    from atlas_cuda import ops_attention
    from atlas_cuda.attention_plan import mma_decode_plan
    original = be.policy
    be.set_policy(dataclasses.replace(original, decode_plan="mma"))
    h, kh, d = HEADS["qwen3-8b"]
    print("mma splits | batch | ctx | KV MB | floor us | plan | splits: us ...")
    try:
        for batch, ctx in ((1, 1024), (2, 1024), (4, 1024), (8, 1024), (16, 1024), (32, 1024),
                           (8, 8192), (2, 8192)):
            q, kc, vc, bt, sl, cu = _paged(be, bf16, batch, ctx, h, kh, d)
            plan = mma_decode_plan(batch, h, kh, d, ctx, be.num_sms)
            row = []
            for splits in (1, 2, 4, 8, 16, 32, 64):
                if splits > -(-ctx // 64):
                    break
                ops_attention.mma_decode_plan = lambda *a, s=splits: (plan[0], s)
                us = per_op_us(be, lambda: be.ops.paged_attention(q, kc, vc, bt, sl, cu,
                                                                  d ** -0.5))
                row.append(f"{splits}: {us:.2f}")
            ops_attention.mma_decode_plan = mma_decode_plan
            nbytes = 2 * batch * ctx * kh * d * 2
            print(f"mma splits | {batch} | {ctx} | {nbytes / 1e6:.1f} | "
                  f"{nbytes / FLOOR_BPS * 1e6:.2f} | {plan} | " + " | ".join(row))
            del kc, vc
    finally:
        ops_attention.mma_decode_plan = mma_decode_plan
        be.set_policy(original)
    from atlas_cuda.ops_attention import AttentionOps
    print("window decode (16/8/256, window 1,024) | batch | ctx | mma us | swa us")
    for batch, ctx in ((1, 1024), (1, 4096), (8, 1024), (32, 1024)):
        q, kc, vc, bt, sl, cu = _paged(be, bf16, batch, ctx, 16, 8, 256)
        us = []
        for plan in ("auto", "split"):
            be.set_policy(dataclasses.replace(original, decode_plan=plan))
            ops = be.ctx.bind(AttentionOps)
            us.append(per_op_us(be, lambda: ops.window_decode(q, kc, vc, bt, sl, cu, 1.0, 1024)))
        be.set_policy(original)
        print(f"window decode | {batch} | {ctx} | {us[0]:.2f} | {us[1]:.2f}")
        del kc, vc


def gemma_full(be, bf16) -> None:
    """Gemma-4's full-attention decode (head dim 512, window 0): the tensor-core kernel under
    its plan and forced heads a block, against atlas-gemma4's CUDA-core ``swa_split``."""
    from atlas_cuda import ops_attention
    from atlas_cuda.attention_plan import mma_512_splits, mma_decode_plan
    from atlas_cuda.ops_attention import AttentionOps
    from atlas_gemma4.cuda.gemma4_ops import Gemma4CudaOps
    ops, own = be.ctx.bind(AttentionOps), be.ctx.bind(Gemma4CudaOps)
    import dataclasses
    from atlas_cuda.attention_plan import mma_merge_plan
    original = be.policy
    print("gemma full 512 | heads q/kv | batch | ctx | KV MB | floor us | plan | plan us | "
          "hb 8 / 4 / 2 us | merge kernel (plan) us | swa_split us")
    for h, kh in ((16, 2), (32, 4)):
        for batch, ctx in ((1, 1024), (1, 8192), (1, 32768), (8, 32768), (32, 8192)):
            q, kc, vc, bt, sl, cu = _paged(be, bf16, batch, ctx, h, kh, 512)
            call = lambda: ops.window_decode(q, kc, vc, bt, sl, cu, 512 ** -0.5, 0)  # noqa: E731
            plan = mma_decode_plan(batch, h, kh, 512, ctx, be.num_sms)
            us = per_op_us(be, call)
            forced = []
            for hb in (8, 4, 2):
                splits = mma_512_splits(batch, h, kh, hb, ctx, be.num_sms)
                ops_attention.mma_decode_plan = lambda *a, p=(hb, splits): p
                try:
                    forced.append(f"{per_op_us(be, call):.2f} ({splits})")
                finally:
                    ops_attention.mma_decode_plan = mma_decode_plan
            be.set_policy(dataclasses.replace(original, decode_merge="kernel"))
            try:
                merged = ops.ctx.bind(AttentionOps)
                kern = per_op_us(be, lambda: merged.window_decode(q, kc, vc, bt, sl, cu,
                                                                  512 ** -0.5, 0))
            finally:
                be.set_policy(original)
            merge_plan = mma_merge_plan(batch, h, kh, 512, ctx, be.num_sms)
            out = be.empty(q.shape, bf16)
            swa = per_op_us(be, lambda: own._split(out, q, kc, vc, bt, sl, cu, 512 ** -0.5, 0))
            nbytes = 2 * batch * ctx * kh * 512 * 2
            print(f"gemma full 512 | {h}/{kh} | {batch} | {ctx} | {nbytes / 1e6:.1f} | "
                  f"{nbytes / FLOOR_BPS * 1e6:.2f} | {plan} | {us:.2f} | {' / '.join(forced)} | "
                  f"{kern:.2f} {merge_plan} | {swa:.2f}")
            del kc, vc
    # as a decode graph sees them: 1,056 keys in tables 32,832 tokens wide (the plan's width),
    # the full layers (window 0) and the sliding ones (window 1,024) of both shapes
    print("gemma decode, 32k-wide tables | heads q/kv/d | window | batch | default us | "
          "decode_plan=split us | swa_split us")
    for h, kh, d, window in ((16, 2, 512, 0), (32, 4, 512, 0), (16, 8, 256, 1024),
                             (32, 16, 256, 1024)):
        for batch in (1, 8):
            q, kc, vc, bt, sl, cu = _paged(be, bf16, batch, 1056, h, kh, d, table=32832)
            row = []
            for plan in ("auto", "split"):
                be.set_policy(dataclasses.replace(original, decode_plan=plan))
                ops = be.ctx.bind(AttentionOps)
                call = lambda: ops.window_decode(q, kc, vc, bt, sl, cu, d ** -0.5,  # noqa: E731
                                                 window)
                row.append("-" if call() is None else f"{per_op_us(be, call):.2f}")
            be.set_policy(original)
            out = be.empty(q.shape, bf16)
            swa = per_op_us(be, lambda: own._split(out, q, kc, vc, bt, sl, cu, d ** -0.5, window))
            print(f"gemma decode, 32k-wide tables | {h}/{kh}/{d} | {window} | {batch} | "
                  f"{row[0]} | {row[1]} | {swa:.2f}")
            del kc, vc


def odd_groups(be, bf16) -> None:
    """GQA groups of 5, 6 and 7 at head dim 128: each decode plan, per op."""
    import dataclasses
    original = be.policy
    print("odd groups | heads q/kv/d | batch | ctx | KV MB | floor us | auto | mma | split | "
          "shared us")
    for h, kh in ((48, 8), (40, 8), (28, 4)):
        for batch, ctx in ((1, 1024), (1, 4096), (1, 16384), (1, 32768), (8, 1024), (8, 8192),
                           (32, 1024), (8, 32768)):
            q, kc, vc, bt, sl, cu = _paged(be, bf16, batch, ctx, h, kh, 128)
            row = []
            for plan in ("auto", "mma", "split", "shared"):
                be.set_policy(dataclasses.replace(original, decode_plan=plan))
                row.append(per_op_us(be, lambda: be.ops.paged_attention(q, kc, vc, bt, sl, cu,
                                                                        128 ** -0.5)))
            be.set_policy(original)
            nbytes = 2 * batch * ctx * kh * 128 * 2
            print(f"odd groups | {h}/{kh}/128 | {batch} | {ctx} | {nbytes / 1e6:.1f} | "
                  f"{nbytes / FLOOR_BPS * 1e6:.2f} | " + " | ".join(f"{u:.2f}" for u in row))
            del kc, vc


def merge(be, bf16) -> None:
    """decode_merge=block against kernel, per op, tables as wide as the context."""
    import dataclasses

    from atlas_cuda.attention_plan import mma_decode_plan, mma_merge_plan
    original = be.policy
    print("merge | heads q/kv/d | batch | ctx | KV MB | floor us | block (plan) us | "
          "kernel (plan) us")
    for h, kh, d in ((32, 8, 128), (32, 4, 128), (32, 2, 128), (16, 2, 256), (48, 8, 128)):
        for batch, ctx in ((1, 4096), (1, 32768), (4, 32768), (8, 32768)):
            q, kc, vc, bt, sl, cu = _paged(be, bf16, batch, ctx, h, kh, d)
            us = []
            for kind in ("block", "kernel"):
                be.set_policy(dataclasses.replace(original, decode_plan="mma", decode_merge=kind))
                us.append(per_op_us(be, lambda: be.ops.paged_attention(q, kc, vc, bt, sl, cu,
                                                                       d ** -0.5)))
            be.set_policy(original)
            plans = (mma_decode_plan(batch, h, kh, d, ctx, be.num_sms),
                     mma_merge_plan(batch, h, kh, d, ctx, be.num_sms))
            nbytes = 2 * batch * ctx * kh * d * 2
            print(f"merge | {h}/{kh}/{d} | {batch} | {ctx} | {nbytes / 1e6:.1f} | "
                  f"{nbytes / FLOOR_BPS * 1e6:.2f} | {us[0]:.2f} {plans[0]} | "
                  f"{us[1]:.2f} {plans[1]}")
            del kc, vc


def sampling(be) -> None:
    print("sample (vocab 151936) | rows | temperature | us")
    vocab = 151936
    for n in (1, 8):
        logits = be.empty((n, vocab), np.float32)
        be.fill_random(logits, 5, 3.0)
        for temp in (0.0, 1.0):
            args = [be.from_host(a) for a in (
                np.full(n, temp, np.float32), np.zeros(n, np.int32), np.ones(n, np.float32),
                np.zeros(n, np.float32), np.arange(n, dtype=np.uint64), np.zeros(n, np.int64))]
            new = per_op_us(be, lambda: be.ops.sample(logits, *args))
            print(f"sample | {n} | {temp} | {new:.2f}")


def precompile() -> None:
    """Build every kernel module for sm_90a into the disk cache, in parallel."""
    from concurrent.futures import ProcessPoolExecutor
    from atlas_cuda import compiler
    from atlas_core.env import cache_dir
    from atlas_cuda.targets import generic_kernel_dir
    sources = compiler.KernelSources([generic_kernel_dir() / "common"])
    jobs = [(m, v) for m in sources.modules() for v in sources.variants(m)]
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        list(pool.map(_build, [(sources, m, v, cache_dir()) for m, v in jobs]))
    print(f"precompiled {len(jobs)} module builds")


def _build(job) -> int:
    from atlas_cuda import compiler
    sources, module, variant, cache = job
    return len(compiler.compile_module(sources, module, variant, "sm_90a", cache))


def main() -> None:
    if "--precompile" in sys.argv:
        precompile()
        return
    from atlas_core.ops._dtypes import bfloat16
    from atlas_cuda.backend import CudaBackend
    be = CudaBackend()
    sections = {"--rope-attention": rope_attention, "--mma-splits": mma_splits,
                "--odd-groups": odd_groups, "--merge": merge, "--gemma-full": gemma_full}
    for flag, section in sections.items():
        if flag in sys.argv:
            section(be, bfloat16)
            return
    attention(be, bfloat16)
    sweep(be, bfloat16)
    rope(be, bfloat16)
    sampling(be)


if __name__ == "__main__":
    main()
