"""Which kernels an nvfp4 (uint8) KV cache takes on cuda, planned on the host (no GPU): the
packed write, the CUDA-core decode kernel (never the tensor-core or fused rope + decode ones),
the dequantizing gather + flash kernel for prefill over a history."""

import numpy as np
import pytest

from atlas_core.api import bfloat16


class Arr:
    """Shape, dtype, size and a null pointer: enough for the ops' host-side planning."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.size = int(np.prod(self.shape))
        self.ptr, self.owner = 0, None


def ops_and_launches(**policy):
    from atlas_cuda.ops_attention import AttentionOps
    from atlas_cuda.policy import KernelPolicy
    from fake_context import fake_context
    ctx = fake_context(KernelPolicy(**policy))
    return AttentionOps(ctx), ctx.kernels.launches


def cache(blocks=64, kh=8, d=128):
    return Arr((blocks, 16, kh, d // 2 + d // 16), np.uint8)


@pytest.mark.parametrize("decode_plan", ["auto", "mma", "shared", "split"])
@pytest.mark.parametrize("max_blocks", [4, 2560])
def test_decode_reads_the_packed_rows_directly(decode_plan, max_blocks):
    ops, launches = ops_and_launches(decode_plan=decode_plan)
    q = Arr((4, 32, 128), bfloat16)
    tables = Arr((4, max_blocks), np.int32)
    ops.paged_attention(q, cache(), cache(), tables, Arr((4,), np.int32), Arr((5,), np.int32),
                        0.1)
    (name, *_), = launches
    assert name.startswith("attn_dec_nvfp4_bf16_d128_h")


def test_prefill_over_a_history_dequantizes_then_takes_the_flash_kernel():
    ops, launches = ops_and_launches()
    q = Arr((512, 32, 128), bfloat16)
    ops.paged_attention(q, cache(), cache(), Arr((1, 40), np.int32), Arr((1,), np.int32),
                        Arr((2,), np.int32), 0.1)
    names = [launch[0] for launch in launches]
    assert names == ["kv_nvfp4_gather_bf16", "flash_bf16_d128"]
    grid = launches[0][1]
    assert grid == 40  # one CUDA block per (sequence, table entry)


def test_a_gather_too_large_for_the_scratch_keeps_the_decode_kernel():
    ops, launches = ops_and_launches()
    q = Arr((4096, 32, 128), bfloat16)
    ops.paged_attention(q, cache(), cache(), Arr((64, 40960), np.int32), Arr((64,), np.int32),
                        Arr((65,), np.int32), 0.1)
    (name, *_), = launches
    assert name.startswith("attn_dec_nvfp4_bf16_d128_h")


def test_cache_writes_pack_the_rows():
    ops, launches = ops_and_launches()
    k = Arr((7, 8, 128), bfloat16)
    ops.reshape_and_cache(k, k, cache(), cache(), Arr((7,), np.int32))
    (name, grid, _, args, _), = launches
    assert name == "kv_nvfp4_write_bf16" and grid == 7 and args[-3:] == (8, 128, 1.0)
    launches.clear()
    qkv = Arr((3, (32 + 2 * 8) * 128), bfloat16)
    ops.qk_norm_rope_and_cache(qkv, Arr((3,), np.int32), Arr((64, 128), np.float32), cache(),
                               cache(), Arr((3,), np.int32), num_heads=32, num_kv_heads=8,
                               head_dim=128)
    assert [launch[0] for launch in launches] == ["rope_qkv_bf16", "kv_nvfp4_write_bf16"]
    # the rope kernel wrote dense rows (no slot mapping), the write packed them
    assert launches[0][3][11] is None


def test_fused_rope_decode_is_not_taken_for_nvfp4():
    from types import SimpleNamespace
    ops, launches = ops_and_launches()
    # the unfused path calls the backend's op table: these two ops
    ops.ctx.ops = SimpleNamespace(qk_norm_rope_and_cache=ops.qk_norm_rope_and_cache,
                                  paged_attention=ops.paged_attention)
    qkv = Arr((2, (32 + 2 * 8) * 128), bfloat16)
    ops.rope_cache_attention(qkv, Arr((2,), np.int32), Arr((64, 128), np.float32), cache(),
                             cache(), Arr((2,), np.int32), Arr((2, 4), np.int32),
                             Arr((2,), np.int32), Arr((3,), np.int32), 0.1, num_heads=32,
                             num_kv_heads=8, head_dim=128)
    names = [launch[0] for launch in launches]
    assert names[0] == "rope_qkv_bf16" and names[1] == "kv_nvfp4_write_bf16"
    assert names[2].startswith("attn_dec_nvfp4_bf16_d128_h") and len(names) == 3


def test_wrong_rows_and_head_dims_are_refused():
    ops, _ = ops_and_launches()
    k = Arr((2, 8, 128), bfloat16)
    with pytest.raises(ValueError, match="nvfp4 KV cache of head_dim 128 needs rows of 72"):
        ops.reshape_and_cache(k, k, cache(d=64), cache(d=64), Arr((2,), np.int32))
    q = Arr((1, 8, 32), bfloat16)
    with pytest.raises(ValueError, match="nvfp4 KV cache needs head_dim in"):
        ops.paged_attention(q, cache(kh=2, d=32), cache(kh=2, d=32), Arr((1, 4), np.int32),
                            Arr((1,), np.int32), Arr((2,), np.int32), 0.1)


def test_the_backend_declares_nvfp4():
    from atlas_cuda.backend import CudaBackend
    assert "nvfp4" in CudaBackend.kv_cache_dtypes
