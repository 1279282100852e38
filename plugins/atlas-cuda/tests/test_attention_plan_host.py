"""Split decode attention's (heads per block, splits) plan (no GPU needed): measured bests on an
H200 (132 SMs), docs/benchmarks.md; and the kernel prefill attention picks, causal or not."""

import numpy as np
import pytest

from atlas_cuda.attention_plan import BLOCKS_PER_SM, COMBINE_FLOATS, decode_plan


@pytest.mark.parametrize("t,h,kh,d,ctx,want", [
    (1, 32, 4, 128, 4096, (1, 8)),    # qwen3-30b-a3b batch 1: one head, 8 splits (not 2 x 16)
    (1, 32, 8, 128, 4096, (1, 8)),    # qwen3-8b
    (1, 16, 8, 128, 4096, (1, 16)),   # qwen3-0.6b (not 2 x 32)
    (1, 16, 2, 256, 4096, (1, 16)),   # qwen3.5-35b-a3b's attention layers
    (1, 32, 4, 128, 128, (1, 4)),     # a short cache: splits of at least a round of keys
    (32, 32, 8, 128, 4096, (4, 1)),   # 32 tokens fill the wave: 4 heads share K/V, no split
])
def test_decode_plan(t, h, kh, d, ctx, want):
    assert decode_plan(t, h, kh, d, ctx, 132) == want


@pytest.mark.parametrize("t", [1, 2, 3, 8, 32, 256])
@pytest.mark.parametrize("h,kh,d", [(32, 4, 128), (32, 8, 128), (16, 2, 256), (8, 8, 64)])
def test_decode_plan_limits(t, h, kh, d):
    hb, splits = decode_plan(t, h, kh, d, 32768, 132)
    assert (h // kh) % hb == 0
    assert splits * hb * d <= COMBINE_FLOATS or splits == 1
    blocks = t * kh * (h // kh // hb) * splits
    assert splits == 1 or blocks <= BLOCKS_PER_SM * 132


@pytest.mark.parametrize("t,h,kh,d,ctx,want", [
    (1, 32, 8, 128, 40960, (4, 33)),    # qwen3-8b batch 1: one block per KV head and split
    (8, 32, 8, 128, 40960, (4, 4)),
    (1, 32, 4, 128, 40960, (4, 33)),    # qwen3-30b-a3b (group 8): two blocks a KV head
    (1, 32, 8, 128, 100, (4, 4)),       # a short cache: a split per round of keys
    (1, 14, 2, 64, 40960, (1, 18)),     # group 7: one head a block
])
def test_shared_plan_reads_each_kv_head_once(t, h, kh, d, ctx, want):
    from atlas_cuda.attention_plan import shared_decode_plan
    assert shared_decode_plan(t, h, kh, d, ctx, 132) == want


@pytest.mark.parametrize("choice,ctx,want", [("auto", 4096, (1, 8)), ("auto", 4097, (4, 33)),
                                             ("split", 40960, (1, 8)), ("shared", 512, (4, 16))])
def test_policy_picks_the_plan_by_cache_length(choice, ctx, want):
    from atlas_cuda.ops_attention import AttentionOps
    from atlas_cuda.policy import KernelPolicy
    from fake_context import fake_context
    ops = AttentionOps(fake_context(KernelPolicy(decode_plan=choice)))
    assert ops._decode_plan(1, 32, 8, 128, ctx) == want


@pytest.mark.parametrize("dtype,d,causal,policy,want", [
    ("bfloat16", 64, True, "auto", "flash_bf16_d64"),           # causal: the kernels as before
    ("float16", 128, True, "auto", "flash_f16_d128"),
    ("bfloat16", 64, False, "auto", "flash_bidir_bf16_d64"),
    ("bfloat16", 80, False, "auto", "flash_bidir_bf16_d80"),
    ("bfloat16", 80, True, "simt", "flash_bf16_d80"),          # no CUDA-core kernel at 80
    ("bfloat16", 64, False, "simt", "attn_bidir_bf16_d64_h"),
    ("float32", 128, False, "auto", "attn_bidir_f32_d128_h"),
    ("float32", 64, True, "auto", "attn_dec_f32_d64_h"),
])
def test_prefill_attention_picks_the_kernel(dtype, d, causal, policy, want):
    from atlas_core.api import as_dtype
    from atlas_cuda.ops_attention import AttentionOps
    from atlas_cuda.policy import KernelPolicy
    from fake_context import FakeArray, fake_context
    ctx = fake_context(KernelPolicy(attention=policy))
    q, kv = FakeArray((200, 8, d), as_dtype(dtype)), FakeArray((200, 2, d), as_dtype(dtype))
    AttentionOps(ctx).prefill_attention(q, kv, kv, FakeArray((3,), np.int32), 0.1, causal=causal)
    (name, *_), = ctx.kernels.launches
    assert name.startswith(want)


def test_prefill_attention_refuses_a_head_dim_no_kernel_has():
    from atlas_cuda.ops_attention import AttentionOps
    from fake_context import FakeArray, fake_context
    q = FakeArray((200, 8, 80), np.float32)
    with pytest.raises(ValueError, match="head_dim 80"):
        AttentionOps(fake_context()).prefill_attention(q, q, q, FakeArray((3,), np.int32), 0.1,
                                                       causal=False)


@pytest.mark.parametrize("h,kh,want", [(32, 8, 4), (32, 4, 8), (16, 2, 8), (16, 8, 2),
                                       (64, 2, 16), (48, 1, 16), (16, 16, 0), (24, 8, 3),
                                       (48, 8, 6), (40, 8, 5), (28, 4, 7), (40, 2, 0), (36, 4, 0)])
def test_mma_decode_heads(h, kh, want):
    from atlas_cuda.attention_plan import mma_decode_heads
    assert mma_decode_heads(h, kh) == want


@pytest.mark.parametrize("d", [64, 256, 512])
def test_odd_groups_have_kernels_at_head_dim_128_only(d):
    from atlas_cuda.attention_plan import mma_decode_heads
    assert mma_decode_heads(48, 8, d) == 0 and mma_decode_heads(32, 8, d) == 4


def test_every_planned_head_count_has_a_kernel():
    import re
    from pathlib import Path

    from atlas_cuda.attention_plan import mma_decode_heads
    src = (Path(__file__).parents[3] / "kernels/cuda/common/attention_decode_mma.cu").read_text()
    have = {(int(d), int(hb)) for d, hb in re.findall(r"DECM_ONE\(T, S, (\d+), (\d+)\)", src)}
    have |= {(d, hb) for d in (64, 128, 256) for hb in (2, 4, 8, 16)}  # DECM_D
    for d in (64, 128, 256):
        for kh in (1, 2, 4, 8):
            for group in range(1, 33):
                hb = mma_decode_heads(group * kh, kh, d)
                assert hb == 0 or (d, hb) in have, (d, group, hb)


@pytest.mark.parametrize("t,h,kh,d,ctx,want", [
    (1, 32, 8, 128, 32768, (4, 33)),    # a wave of two blocks an SM: 264 // 8
    (1, 16, 2, 256, 32768, (8, 64)),    # one block an SM at 256; partials cap 131072 // (8 x 256)
    (8, 32, 8, 128, 32768, (4, 4)),
    (1, 32, 8, 128, 100, (4, 2)),       # at least one 64-key tile a split
    (64, 32, 8, 128, 8192, (4, 1)),
    # head dim 512, the cost model's pick (the fastest of 8 / 4 / 2 heads in session 24's
    # per-op times at these shapes)
    (1, 16, 2, 512, 32768, (4, 33)),    # 8 heads: 2 x 32 blocks (partials cap); 4: 4 x 33
    (1, 32, 4, 512, 32768, (8, 32)),    # 8 heads: 128 blocks, the cache read once
    (1, 32, 4, 512, 1024, (4, 16)),     # short: a smaller merge, the re-reads hit L2
    (1, 16, 2, 512, 1024, (2, 16)),
    (32, 16, 2, 512, 32768, (8, 2)),    # 128 blocks; fewer heads read the cache again
    (32, 32, 4, 512, 32768, (8, 1))])
def test_mma_decode_plan(t, h, kh, d, ctx, want):
    from atlas_cuda.attention_plan import mma_decode_plan
    assert mma_decode_plan(t, h, kh, d, ctx, 132) == want


def test_mma_decode_smem_fits_two_blocks_an_sm_up_to_128():
    from atlas_cuda.attention_plan import mma_decode_smem
    assert 2 * mma_decode_smem(128, 2) <= 227 << 10
    assert 2 * mma_decode_smem(64, 2) <= 227 << 10
    assert mma_decode_smem(256, 2) <= 227 << 10
    # 512: 16 query rows and three stages of 32 keys (216,320 bytes) beside the kernel's 1,552
    # static bytes, one block an SM
    assert mma_decode_smem(512, 2) == 216320 and mma_decode_smem(512, 2) + 1552 <= 227 << 10


@pytest.mark.parametrize("choice,ctx,dtype,cache,want", [
    ("auto", 512, "bfloat16", "bfloat16", False), ("auto", 513, "bfloat16", "bfloat16", True),
    ("mma", 512, "bfloat16", "bfloat16", True), ("shared", 40960, "bfloat16", "bfloat16", False),
    ("auto", 40960, "bfloat16", "float8_e4m3fn", False), ("auto", 40960, "float32", "float32",
                                                          False)])
def test_policy_picks_the_mma_decode_kernel(choice, ctx, dtype, cache, want):
    import numpy as np
    from types import SimpleNamespace
    from atlas_core.api import as_dtype
    from atlas_cuda.ops_attention import AttentionOps
    from atlas_cuda.policy import KernelPolicy
    from fake_context import fake_context
    ops = AttentionOps(fake_context(KernelPolicy(decode_plan=choice)))
    q = SimpleNamespace(dtype=np.dtype(as_dtype(dtype)))
    k = SimpleNamespace(dtype=np.dtype(as_dtype(cache)))
    assert ops._use_mma_decode(q, k, 32, 8, 128, ctx) == want


def test_batch_invariant_mode_keeps_the_cuda_core_kernel():
    import numpy as np
    from types import SimpleNamespace
    from atlas_core.api import bfloat16
    from atlas_cuda.ops_attention import AttentionOps
    from atlas_cuda.policy import KernelPolicy, with_batch_invariance
    from fake_context import fake_context
    ops = AttentionOps(fake_context(with_batch_invariance(KernelPolicy())))
    q = SimpleNamespace(dtype=np.dtype(bfloat16))
    assert not ops._use_mma_decode(q, q, 32, 8, 128, 40960)


@pytest.mark.parametrize("t,ctx,want", [(1, 16384, False), (1, 16385, True), (2, 600, True),
                                        (3, 600, True)])
def test_one_query_token_keeps_the_fused_kernel_below_16k(t, ctx, want):
    import numpy as np
    from types import SimpleNamespace
    from atlas_core.api import bfloat16
    from atlas_cuda.ops_attention import AttentionOps
    from atlas_cuda.policy import KernelPolicy
    from fake_context import fake_context
    ops = AttentionOps(fake_context(KernelPolicy()))
    q = SimpleNamespace(dtype=np.dtype(bfloat16))
    assert ops._use_mma_decode(q, q, 32, 8, 128, ctx, t) == want


@pytest.mark.parametrize("h,kh,ctx,want", [(40, 8, 4096, False), (40, 8, 4097, True),
                                           (48, 8, 8192, True), (28, 4, 1024, False),
                                           (32, 8, 8192, False), (24, 8, 8192, True)])
def test_one_query_token_of_an_odd_group_takes_tensor_cores_past_4k(h, kh, ctx, want):
    """Groups of 3, 5, 6, 7 at 128: the fused CUDA-core kernel takes 1-2 of their heads a block,
    so the tensor-core kernel wins from a shorter cache (session 25, qwen3-14b step times)."""
    import numpy as np
    from types import SimpleNamespace
    from atlas_core.api import bfloat16
    from atlas_cuda.ops_attention import AttentionOps
    from atlas_cuda.policy import KernelPolicy
    from fake_context import fake_context
    ops = AttentionOps(fake_context(KernelPolicy()))
    q = SimpleNamespace(dtype=np.dtype(bfloat16))
    assert ops._use_mma_decode(q, q, h, kh, 128, ctx, 1) == want
