"""The decode GEMV tile picks (no GPU needed): measured bests on an H200, docs/benchmarks.md."""

import pytest

from atlas_cuda.ops_gemv import gemv_tile


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
def test_auto_tiles(monkeypatch, n, k, fused_norm, pair, want):
    monkeypatch.delenv("ATLAS_CUDA_GEMV_TILE", raising=False)
    assert gemv_tile(n, k, fused_norm, pair) == want


def test_forced_tile_caps_gate_up_columns(monkeypatch):
    monkeypatch.setenv("ATLAS_CUDA_GEMV_TILE", "g4s2")
    assert gemv_tile(4096, 4096, True, False) == (4, 2)
    assert gemv_tile(4096, 4096, True, True) == (2, 2)


def test_two_weight_groups_early_only_after_latency_bound_kernels(monkeypatch):
    """``ATLAS_CUDA_GEMV_PRELOAD=auto`` picks the ``_p2`` GEMV right after decode attention or
    a GDN recurrent step (DRAM idles there), not after another GEMV; ``one`` / ``two`` force."""
    from types import SimpleNamespace

    from atlas_cuda.ops_gemv import GemvOps

    ops = GemvOps()
    ops.be = SimpleNamespace(kernels=SimpleNamespace(last_module="attention_rope_decode"))
    monkeypatch.delenv("ATLAS_CUDA_GEMV_PRELOAD", raising=False)
    assert ops._preload_two()
    for module in ("attention_decode", "delta_rule"):
        ops.be.kernels.last_module = module
        assert ops._preload_two()
    for module in ("gemv_norm", "moe_experts1", None):
        ops.be.kernels.last_module = module
        assert not ops._preload_two()
    monkeypatch.setenv("ATLAS_CUDA_GEMV_PRELOAD", "two")
    assert ops._preload_two()
    monkeypatch.setenv("ATLAS_CUDA_GEMV_PRELOAD", "one")
    ops.be.kernels.last_module = "attention_rope_decode"
    assert not ops._preload_two()
