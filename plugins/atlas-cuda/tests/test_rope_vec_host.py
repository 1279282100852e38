"""Which rope prologue kernel the cuda backend launches (policy ``rope``), without a GPU; the
kernels themselves: test_rope_vec_cuda.py."""

from types import SimpleNamespace

import numpy as np
import pytest

from atlas_cuda.ops_attention import AttentionOps
from atlas_cuda.policy import KernelPolicy
from fake_context import fake_context


def _arr(shape, ptr=0, dtype="bfloat16"):
    from atlas_core.api import as_dtype
    return SimpleNamespace(shape=tuple(shape), ptr=ptr, dtype=as_dtype(dtype))


@pytest.mark.parametrize("rope,d,rot,ptr,want", [
    ("vec", 256, None, 0, True), ("vec", 512, 128, 0, True),
    ("vec", 128, None, 0, False),      # not a vec head dim
    ("vec", 256, 100, 0, False),       # a rotary width that does not split into whole lanes
    ("vec", 256, None, 8, False),      # rows not 16-byte aligned
    ("auto", 256, None, 0, True), ("auto", 128, None, 0, False),
    ("generic", 512, None, 0, False)])
def test_rope_vec_choice(rope, d, rot, ptr, want):
    ops = AttentionOps(fake_context(KernelPolicy(rope=rope)))
    q, k = _arr((3, 4, d)), _arr((3, 2, d), ptr)
    assert ops._rope_vec(d, rot, q, k, None, (4 * d, 2 * d, 0)) is want


def test_rope_vec_launch_names_and_arguments():
    ctx = fake_context(KernelPolicy(rope="vec"))
    ops = AttentionOps(ctx)
    t, h, kh, d = 3, 4, 2, 256
    q_out, k_cache = _arr((t, h, d)), _arr((5, 16, kh, d))
    q, k, v = _arr((t,)), _arr((t,)), _arr((t,))
    norm = _arr((d,), dtype="float32")
    ops._rope(q_out, k_cache, k_cache, q, k, v, ((h + 2 * kh) * d,) * 3, _arr((t,)),
              _arr((512, d)), _arr((t,)), norm, norm, (h, kh, d), 1e-6, None, True, 1.0,
              v_norm=norm)
    name, grid, shmem, args, pdl = ctx.kernels.launches[-1]
    assert name == "rope_vec_vn_nf32_d256_bf16"
    assert grid == (t, 2) and shmem == 0
    assert len(args) == 22 and args[14] is norm  # v_norm after q_norm, k_norm
    ops._rope(q_out, k_cache, k_cache, q, k, None, ((h + 2 * kh) * d,) * 3, _arr((t,)),
              _arr((512, d)), _arr((t,)), None, None, (h, kh, d), 1e-6, None, True, 1.0)
    name, _, _, args, _ = ctx.kernels.launches[-1]
    assert name == "rope_vec_d256_bf16" and args[14] is None
