"""Batch-invariant mode of the cuda backend, host side (no GPU needed): the policy preset and how
it is resolved, and the one kernel each op then launches whatever the number of rows, tokens
or sequences in the step (the bitwise checks on a GPU: test_batch_invariant_cuda.py)."""

import numpy as np
import pytest

from atlas_core.api import as_dtype
from atlas_cuda.attention_plan import batch_invariant_decode_plan
from atlas_cuda.ops_attention import AttentionOps
from atlas_cuda.ops_gemv import gemv_rows
from atlas_cuda.policy import (BATCH_INVARIANT_FIELDS, KernelPolicy, resolve,
                               with_batch_invariance)
from fake_context import FakeArray, fake_context

BF16 = as_dtype("bfloat16")
BI = with_batch_invariance(KernelPolicy())


class Arr(FakeArray):
    """A fake device array with what the dense ops read (16-byte aligned)."""

    def __init__(self, shape, dtype=BF16):
        super().__init__(shape, dtype)
        self.size, self.ptr = int(np.prod(self.shape)), 0


def test_preset_fields():
    assert BI.batch_invariant
    assert (BI.gemm, BI.attention, BI.moe, BI.moe_fused) == ("mma", "simt", "grouped", "0")
    assert (BI.gdn_fused, BI.gdn_prefill, BI.quant_weights) == (False, "sequential", False)
    assert dict(BI.origins)["gemm"] == "batch_invariant"
    assert with_batch_invariance(BI) == BI
    assert {name for name, _ in BATCH_INVARIANT_FIELDS} <= set(KernelPolicy.__dataclass_fields__)


def test_environment_turns_it_on_and_wins_over_conflicting_fields():
    p = resolve({"gemm": "cublaslt"}, {}, {"ATLAS_CUDA_BATCH_INVARIANT": "1",
                                           "ATLAS_CUDA_MOE": "gemv"})
    assert p.batch_invariant and (p.gemm, p.moe) == ("mma", "grouped")
    assert dict(p.origins)["gemm"] == "ATLAS_CUDA_BATCH_INVARIANT"
    assert "batch_invariant=1" in p.summary()
    assert resolve({}, {}, {"ATLAS_CUDA_BATCH_INVARIANT": "0"}) == KernelPolicy()
    with pytest.raises(ValueError, match="ATLAS_CUDA_BATCH_INVARIANT='maybe' is not valid"):
        resolve({}, {}, {"ATLAS_CUDA_BATCH_INVARIANT": "maybe"})


def test_no_linear_takes_a_gemv():
    assert gemv_rows(KernelPolicy()) == 1 and gemv_rows(BI) == 0
    assert gemv_rows(KernelPolicy(gemv_rows=8, batch_invariant=True)) == 0


@pytest.mark.parametrize("m", [1, 2, 8, 9, 33, 200, 1000])
def test_linear_always_takes_the_mma_gemm(m):
    from atlas_cuda.ops import DenseOps
    ctx = fake_context(BI)
    DenseOps(ctx).linear(Arr((m, 256)), Arr((512, 256)))
    (name, *_), = ctx.kernels.launches
    assert name.startswith("gemm_bf16_"), name
    if m == 1:  # the control: the default policy takes the GEMV for one row
        ctx = fake_context(KernelPolicy())
        DenseOps(ctx).linear(Arr((m, 256)), Arr((512, 256)))
        assert ctx.kernels.launches[0][0].startswith("gemvn_")


def test_fused_norm_gemv_is_off():
    from atlas_cuda.ops_gemv import GemvOps
    x, w = Arr((1, 256)), Arr((512, 256))
    assert GemvOps(fake_context(KernelPolicy())).norm_gemv_fusable(x, None, Arr((256,)), w)
    assert not GemvOps(fake_context(BI)).norm_gemv_fusable(x, None, Arr((256,)), w)


@pytest.mark.parametrize("h,kh,want", [(32, 8, 4), (16, 8, 2), (12, 4, 1), (4, 2, 2)])
def test_decode_plan_is_one_split_from_the_model_alone(h, kh, want):
    assert batch_invariant_decode_plan(h, kh) == (want, 1)
    ops = AttentionOps(fake_context(BI))
    for t in (1, 7, 64, 4096):
        for max_ctx in (16, 512, 8192, 131072):
            assert ops._decode_plan(t, h, kh, 128, max_ctx) == (want, 1)


@pytest.mark.parametrize("t,num_seqs,max_blocks", [(1, 1, 4), (1, 1, 300), (64, 64, 300),
                                                   (600, 1, 64), (700, 40, 300)])
def test_paged_attention_is_the_split_k_kernel_with_one_split(t, num_seqs, max_blocks):
    ctx = fake_context(BI)
    q = Arr((t, 32, 128))
    cache = Arr((1000, 16, 8, 128))
    AttentionOps(ctx).paged_attention(q, cache, cache, Arr((num_seqs, max_blocks), np.int32),
                                      Arr((num_seqs,), np.int32),
                                      Arr((num_seqs + 1,), np.int32), 0.1)
    (name, grid, *_), = ctx.kernels.launches
    assert name == "attn_dec_bf16_d128_h4" and grid == (t, 8, 1)


def test_rope_cache_attention_never_takes_the_fused_decode_kernel(monkeypatch):
    import atlas_cuda.ops_attention as mod
    monkeypatch.setattr(mod, "compose_rope_cache_attention", lambda *a, **k: "two ops")
    ctx = fake_context(BI)
    qkv = Arr((1, (32 + 2 * 8) * 128))
    cache = Arr((100, 16, 8, 128))
    args = (qkv, Arr((1,), np.int32), Arr((4096, 128), np.float32), cache, cache,
            Arr((1,), np.int32), Arr((1, 8), np.int32), Arr((1,), np.int32), Arr((2,), np.int32),
            0.1)
    heads = dict(num_heads=32, num_kv_heads=8, head_dim=128)
    assert AttentionOps(ctx).rope_cache_attention(*args, **heads) == "two ops"
    ctx = fake_context(KernelPolicy())  # the control: one decode token takes the fused kernel
    assert AttentionOps(ctx).rope_cache_attention(*args, **heads) != "two ops"
    assert ctx.kernels.launches[-1][0].startswith("rope_attn_dec")


def test_moe_takes_the_grouped_gemm_for_one_pair():
    from atlas_cuda.moe_grouped import use_grouped
    assert use_grouped(1, 128, BF16, BI.moe)
    assert not use_grouped(1, 128, BF16, KernelPolicy().moe)


def test_gdn_prefill_is_token_sequential():
    pytest.importorskip("atlas_qwen35")
    from atlas_qwen35.cuda.gdn_ops import GdnOps
    ctx = fake_context(BI)
    nk, nv, dk, dv, t = 2, 4, 128, 128, 256
    qkv = Arr((t, 2 * nk * dk + nv * dv))
    f32 = np.float32
    GdnOps(ctx).gated_delta_rule_chunked(
        qkv, Arr((t, nv), f32), Arr((t, nv), f32), Arr((4, nv, dk, dv), f32),
        Arr((2,), np.int32), Arr((1,), np.int32), Arr((1,), np.int32), num_k_heads=nk,
        num_v_heads=nv, head_k_dim=dk, head_v_dim=dv)
    assert [launch[0] for launch in ctx.kernels.launches] == ["gated_delta_rule_bf16"]
