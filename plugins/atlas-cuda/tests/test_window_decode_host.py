"""``AttentionOps.window_decode`` (Gemma's decode attention at head sizes up to 256) launches the
tensor-core decode kernel or the split decode kernel's windowed entry with the common arguments,
the window last, without a GPU; its results: plugins/atlas-gemma4/tests/test_gemma4_cuda.py."""

from types import SimpleNamespace

import numpy as np

from atlas_cuda.attention_plan import mma_decode_plan
from atlas_cuda.ops_attention import AttentionOps
from atlas_cuda.policy import KernelPolicy
from fake_context import fake_context


def _arr(shape, dtype="bfloat16"):
    from atlas_core.api import as_dtype
    dt = np.dtype(dtype) if dtype in ("int32", "uint8") else as_dtype(dtype)
    return SimpleNamespace(shape=tuple(shape), ptr=0, dtype=dt)


def test_window_decode_takes_the_mma_kernel_over_the_window():
    """bf16 at batch 1 over a 1,024-key window: ``attn_dec_mma_*`` (no batch-1 limit here), its
    plan from the window's keys; a window of 512 keys or fewer keeps ``attn_dec_swa_*``."""
    ctx = fake_context()
    ops = AttentionOps(ctx)
    q, cache = _arr((1, 16, 256)), _arr((64, 16, 8, 256))
    tables, lens, cu = _arr((1, 256), "int32"), _arr((1,), "int32"), _arr((2,), "int32")
    out = ops.window_decode(q, cache, cache, tables, lens, cu, 1.0, 1024)
    name, grid, _, args, pdl = ctx.kernels.launches[-1]
    hb, splits = mma_decode_plan(1, 16, 8, 256, 1024, ctx.num_sms)
    assert name == f"attn_dec_mma_bf16_d256_h{hb}" and pdl
    assert args[0] is out and args[4] is q and args[-1] == 1024
    assert grid == (1, 8 * (2 // hb), splits)
    ops.window_decode(q, cache, cache, tables, lens, cu, 1.0, 512)
    assert ctx.kernels.launches[-1][0].startswith("attn_dec_swa_bf16_d256_h")


def test_window_decode_takes_the_512_wide_mma_kernel_past_512_keys():
    """Gemma-4's full layers (head dim 512, window 0): ``attn_dec_mma_*_d512_h*`` with its own
    shared memory (32-key tiles) past 512 keys; at 512 keys or fewer, or in float32, None (the
    caller's ``swa_split``)."""
    from atlas_cuda.attention_plan import mma_decode_smem
    ctx = fake_context()
    ops = AttentionOps(ctx)
    q, cache = _arr((1, 16, 512)), _arr((64, 16, 2, 512))
    tables, lens, cu = _arr((1, 64), "int32"), _arr((1,), "int32"), _arr((2,), "int32")
    out = ops.window_decode(q, cache, cache, tables, lens, cu, 1.0, 0)
    name, grid, shmem, args, pdl = ctx.kernels.launches[-1]
    hb, splits = mma_decode_plan(1, 16, 2, 512, 1024, ctx.num_sms)
    assert name == f"attn_dec_mma_bf16_d512_h{hb}" and pdl and args[-1] == 0
    assert args[0] is out and grid == (1, 2 * (8 // hb), splits)
    assert shmem == mma_decode_smem(512, 2)
    short = _arr((1, 32), "int32")
    assert ops.window_decode(q, cache, cache, short, lens, cu, 1.0, 0) is None
    f32, f32_cache = _arr((1, 16, 512), "float32"), _arr((64, 16, 2, 512), "float32")
    assert ops.window_decode(f32, f32_cache, f32_cache, tables, lens, cu, 1.0, 0) is None


def test_window_decode_launches_attn_dec_swa_with_the_window_last():
    ctx = fake_context(KernelPolicy(decode_plan="split"))
    ops = AttentionOps(ctx)
    q, cache = _arr((1, 16, 256)), _arr((64, 16, 8, 256))
    # a table of 256 blocks (4,096 tokens) and a window of 1,024
    tables, lens, cu = _arr((1, 256), "int32"), _arr((1,), "int32"), _arr((2,), "int32")
    out = ops.window_decode(q, cache, cache, tables, lens, cu, 1.0, 1024)
    name, grid, _, args, pdl = ctx.kernels.launches[-1]
    assert name.startswith("attn_dec_swa_bf16_d256_h") and pdl
    assert args[0] is out and args[4] is q and args[-1] == 1024
    # the split plan sees the window's keys, not the table's
    hb, splits = ops._decode_plan(1, 16, 8, 256, 1024)
    assert name.endswith(f"_h{hb}") and grid == (1, 8 * (2 // hb), splits)
    ops.window_decode(q, cache, cache, tables, lens, cu, 1.0, 0)
    _, grid, _, args, _ = ctx.kernels.launches[-1]
    assert args[-1] == 0 and grid[2] == ops._decode_plan(1, 16, 8, 256, 4096)[1]
    # a 512-wide head, or a cache in another dtype, is the caller's
    assert ops.window_decode(_arr((1, 4, 512)), _arr((8, 16, 2, 512)), _arr((8, 16, 2, 512)),
                             tables, lens, cu, 1.0, 0) is None
    fp8 = _arr((64, 16, 8, 256), "uint8")
    assert ops.window_decode(q, fp8, fp8, tables, lens, cu, 1.0, 1024) is None


def test_decode_merge_kernel_takes_the_whole_group_and_a_wave_of_splits():
    """Policy ``decode_merge=kernel`` at head dim 512: ``attn_dec_mma_*_d512_h8_x`` (no in-block
    merge) over the whole GQA group of 8, a wave of splits, then ``attn_dec_merge_*_d512`` a
    block a (token, head) over the same partials and split count; one split needs no merge."""
    from atlas_cuda.attention_plan import mma_merge_plan
    ctx = fake_context(KernelPolicy(decode_merge="kernel"))
    ops = AttentionOps(ctx)
    q, cache = _arr((1, 16, 512)), _arr((4096, 16, 2, 512))
    tables, lens, cu = _arr((1, 2048), "int32"), _arr((1,), "int32"), _arr((2,), "int32")
    out = ops.window_decode(q, cache, cache, tables, lens, cu, 1.0, 0)
    (name, grid, _, args, _), (mname, mgrid, _, margs, mpdl) = ctx.kernels.launches[-2:]
    assert mma_merge_plan(1, 16, 2, 512, 32768, ctx.num_sms) == (8, ctx.num_sms // 2)
    assert name == "attn_dec_mma_bf16_d512_h8_x" and grid == (1, 2, ctx.num_sms // 2)
    assert mname == "attn_dec_merge_bf16_d512" and mgrid == (1, 16) and mpdl
    assert margs[0] is out and margs[1] is args[1] and margs[2] is args[2]   # the partials
    assert margs[3] is lens and margs[4] is cu
    assert list(margs[5:9]) == [16, 1, ctx.num_sms // 2, 0]
    # batch 64: one block a (token, KV head) already fills the GPU: one split, no merge kernel
    q64, tables64 = _arr((64, 16, 512)), _arr((64, 2048), "int32")
    lens64, cu64 = _arr((64,), "int32"), _arr((65,), "int32")
    n = len(ctx.kernels.launches)
    ops.window_decode(q64, cache, cache, tables64, lens64, cu64, 1.0, 0)
    assert [x[0] for x in ctx.kernels.launches[n:]] == ["attn_dec_mma_bf16_d512_h8"]


def test_decode_merge_block_keeps_the_capped_plan():
    ctx = fake_context(KernelPolicy(decode_merge="block"))
    q, cache = _arr((1, 16, 512)), _arr((4096, 16, 2, 512))
    tables, lens, cu = _arr((1, 2048), "int32"), _arr((1,), "int32"), _arr((2,), "int32")
    AttentionOps(ctx).window_decode(q, cache, cache, tables, lens, cu, 1.0, 0)
    hb, splits = mma_decode_plan(1, 16, 2, 512, 32768, ctx.num_sms)
    name, grid, *_ = ctx.kernels.launches[-1]
    assert name == f"attn_dec_mma_bf16_d512_h{hb}" and grid == (1, 2 * (8 // hb), splits)


def test_paged_attention_of_one_token_takes_tensor_cores_past_512_keys():
    """The batch-1 limit is rope_cache_attention's (its fused-rope kernel); a plain
    ``paged_attention`` of one query token (MiniMax-M2, the two-op rope path) takes the
    tensor-core kernel past 512 keys as larger batches do."""
    ctx = fake_context()
    ops = AttentionOps(ctx)
    q, cache = _arr((1, 48, 128)), _arr((80, 16, 8, 128))
    lens, cu = _arr((1,), "int32"), _arr((2,), "int32")
    ops.paged_attention(q, cache, cache, _arr((1, 64), "int32"), lens, cu, 1.0)
    assert ctx.kernels.launches[-1][0] == "attn_dec_mma_bf16_d128_h6"
    ops.paged_attention(q, cache, cache, _arr((1, 32), "int32"), lens, cu, 1.0)
    assert ctx.kernels.launches[-1][0].startswith("attn_dec_bf16_d128_h")


def test_decode_merge_kernel_at_head_dim_128_and_256():
    """``decode_merge=kernel`` below 512 (paged decode of a long cache): the ``_x`` split kernel
    over the whole group, a wave of splits (two blocks an SM up to 128, one at 256), then
    ``attn_dec_merge_*_d<D>``."""
    from atlas_cuda.attention_plan import mma_merge_plan
    for h, kh, d, per_sm in ((16, 2, 128, 2), (16, 2, 256, 1), (48, 8, 128, 2)):
        ctx = fake_context(KernelPolicy(decode_merge="kernel"))
        q, cache = _arr((1, h, d)), _arr((4096, 16, kh, d))
        lens, cu = _arr((1,), "int32"), _arr((2,), "int32")
        AttentionOps(ctx).paged_attention(q, cache, cache, _arr((1, 2048), "int32"), lens, cu, 1.0)
        (name, grid, *_), (mname, mgrid, *_) = ctx.kernels.launches[-2:]
        hb, splits = mma_merge_plan(1, h, kh, d, 32768, ctx.num_sms)
        assert hb == h // kh and splits == per_sm * ctx.num_sms // kh
        assert name == f"attn_dec_mma_bf16_d{d}_h{hb}_x" and grid == (1, kh, splits)
        assert mname == f"attn_dec_merge_bf16_d{d}" and mgrid == (1, h)
