"""The decode GEMV tile picks (no GPU needed): measured bests on an H200, docs/benchmarks.md."""

import pytest

from atlas_cuda.ops_gemv import GemvOps, gemv_tile
from fake_context import FakeArray, fake_context


@pytest.mark.parametrize("n,k,fused_norm,pair,want", [
    (4096, 4096, False, False, (4, 2)),     # qwen3-8b o_proj: two blocks per SM
    (4096, 12288, False, False, (4, 2)),    # qwen3-8b down
    (2048, 4096, False, False, (4, 4)),     # 30B / 35B o_proj
    (2048, 768, False, False, (4, 2)),      # short K: at least 128 blocks
    (6144, 4096, False, False, (1, 2)),     # qkv without the norm
    (151936, 4096, False, False, (1, 2)),   # lm_head
    (151936, 2048, False, False, (2, 1)),   # 30B lm_head: two groups a warp, no split
    (151936, 1024, False, False, (2, 1)),   # 0.6B lm_head
    (6144, 4096, True, False, (2, 1)),      # 8B qkv after the input norm
    (5120, 2048, True, False, (4, 1)),      # 30B qkv: small, four columns per warp
    (12288, 4096, True, True, (1, 1)),      # gate_up + SiLU: gate and up row per column
    (128, 2048, True, False, (1, 8)),       # 30B router after the post-attention norm
    (128, 2048, False, False, (1, 8)),      # the same without the norm
])
def test_auto_tiles(n, k, fused_norm, pair, want):
    assert gemv_tile(n, k, fused_norm, pair) == want


def test_forced_tile_caps_gate_up_columns():
    assert gemv_tile(4096, 4096, True, False, forced=(4, 2)) == (4, 2)
    assert gemv_tile(4096, 4096, True, True, forced=(4, 2)) == (2, 2)


def test_forced_tile_comes_from_the_policy():
    """The context's policy ``gemv_tile`` (``ATLAS_CUDA_GEMV_TILE``) picks the kernel and the
    K split of a decode GEMV; the default picks per shape."""
    from atlas_core.api import bfloat16
    from atlas_cuda.policy import KernelPolicy

    x, w = FakeArray((1, 4096), bfloat16), FakeArray((4096, 4096), bfloat16)
    for policy, name, splits in ((KernelPolicy(), "gemvn_bf16_m1_g4", 2),
                                 (KernelPolicy(gemv_tile=(1, 8)), "gemvn_bf16_m1_g1", 8)):
        ops = GemvOps(fake_context(policy))
        ops.gemv(FakeArray((1, 4096), bfloat16), x, w, None, 1, 4096, 4096)
        (got, grid, _, args, pdl), = ops.ctx.kernels.launches
        assert (got, args[-2], args[-1], pdl) == (name, splits, 0, True)


def test_two_weight_groups_early_only_after_latency_bound_kernels():
    """The ``_p2`` GEMV (two weight groups before the PDL wait) right after decode attention or
    a GDN recurrent step (DRAM idles there), not after another GEMV."""
    ops = GemvOps(fake_context())
    for module in ("attention_rope_decode", "attention_decode", "delta_rule"):
        ops.ctx.kernels.last_module = module
        assert ops._preload_two()
    for module in ("gemv_norm", "moe_experts1", None):
        ops.ctx.kernels.last_module = module
        assert not ops._preload_two()
