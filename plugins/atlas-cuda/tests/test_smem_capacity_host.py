"""Kernels sized for Hopper's 227 KB of shared memory a block on a GB10 (DGX Spark, sm_121:
99 KB, 101,376 bytes), without a GPU: the ops check ``OpContext.fits_smem`` and take the kernel
that fits (the tensor-core decode attention only at head dim 64, the CUDA-core split kernels
above; the register-ring ``qskinny_*`` instead of the ``qskinny2_*`` rings), Hopper keeps its
choices, and a kernel asked for more than the device allows fails with a message that says so
before the driver's opaque one."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from atlas_core.api import OpRegistry, bfloat16
from atlas_cuda.attention_plan import MMA_DECODE_STATIC, mma_decode_smem
from atlas_cuda.ops import build_op_table
from atlas_cuda.ops_attention import AttentionOps
from atlas_cuda.policy import KernelPolicy

from fake_context import FakeBackend, fake_context
from test_ops_quant_host import Dev, DevWorkspace, ScratchBackend, _weight

GB10_OPTIN, HOPPER_OPTIN = 101376, 232448


def _backend(optin, cls=FakeBackend):
    be = cls()
    be.smem_optin = optin
    return be


@pytest.mark.parametrize("optin", [0, HOPPER_OPTIN, GB10_OPTIN])
def test_fits_smem_counts_dynamic_and_static_bytes(optin):
    ctx = fake_context(backend=_backend(optin))
    assert ctx.smem_optin == optin
    assert ctx.fits_smem(mma_decode_smem(64, 2), MMA_DECODE_STATIC)
    hopper_only = ctx.fits_smem(mma_decode_smem(128, 2), MMA_DECODE_STATIC)
    assert hopper_only == (optin != GB10_OPTIN)  # 0: unknown, everything fits
    assert ctx.fits_smem(optin or 1, 0) and (not optin or not ctx.fits_smem(optin, 1))


@pytest.mark.parametrize("d,gb10", [(64, True), (128, False), (256, False), (512, False)])
def test_the_tensor_core_decode_kernel_only_where_its_ring_fits(d, gb10):
    q = SimpleNamespace(dtype=np.dtype(bfloat16))
    for optin, want in ((HOPPER_OPTIN, True), (GB10_OPTIN, gb10)):
        ops = AttentionOps(fake_context(KernelPolicy(decode_plan="mma"), _backend(optin)))
        assert ops._use_mma_decode(q, q, 32, 8, d, 40960) == want


def test_gemma_full_layers_on_gb10_keep_the_callers_kernel():
    """window_decode at head dim 512 (Gemma-4's full layers) returns None on a GB10, so the
    plugin's swa_split runs; at 256 it runs the CUDA-core ``attn_dec_swa_*``."""
    def arr(shape, dtype=bfloat16):
        return SimpleNamespace(shape=tuple(shape), ptr=0, dtype=np.dtype(dtype))

    ctx = fake_context(backend=_backend(GB10_OPTIN))
    ops = AttentionOps(ctx)
    tables, lens, cu = arr((1, 256), np.int32), arr((1,), np.int32), arr((2,), np.int32)
    assert ops.window_decode(arr((1, 16, 512)), arr((64, 16, 2, 512)), arr((64, 16, 2, 512)),
                             tables, lens, cu, 1.0, 0) is None
    ops.window_decode(arr((1, 16, 256)), arr((64, 16, 8, 256)), arr((64, 16, 8, 256)), tables,
                      lens, cu, 1.0, 1024)
    assert ctx.kernels.launches[-1][0].startswith("attn_dec_swa_bf16_d256_h")


def _quant_launches(optin, fn):
    ctx = fake_context(KernelPolicy(gemm="mma", quant_kernel="auto"),
                       backend=_backend(optin, ScratchBackend))
    ctx.workspace = DevWorkspace()
    fn(build_op_table(ctx, OpRegistry.load()))
    return [launch[0] for launch in ctx.kernels.launches]


@pytest.mark.parametrize("m", [1, 2])
def test_the_fused_norm_skinny_kernel_takes_the_register_ring_on_gb10(m):
    """rms_norm_linear at 1-2 rows over FP8: the ``qskinny2_norm_*`` ring (48 KB) plus 96 KB
    for the normed rows does not fit a GB10 block, the register-ring ``qskinny_norm_*`` (96 KB)
    does."""
    def call(table):
        x, nw = Dev((m, 1024), bfloat16), Dev((1024,), bfloat16)
        table.rms_norm_linear(x, Dev((m, 1024), bfloat16), nw, 1e-6,
                              _weight("fp8_block", 512, 1024))
    assert _quant_launches(HOPPER_OPTIN, call) == ["qskinny2_norm_fp8_bf16_n1_m1_d3"]
    assert _quant_launches(GB10_OPTIN, call) == ["qskinny_norm_fp8_bf16_n1_d1"]


@pytest.mark.parametrize("m", [1, 9, 33])
def test_the_plain_skinny_rings_fit_gb10_and_stay(m):
    """Without the norm's rows every configured ring (at most 96 KB) fits a GB10 block: the
    same kernels as on Hopper."""
    def call(table):
        table.linear(Dev((m, 4096), bfloat16), _weight("fp8_block", 4096, 4096))
        table.linear(Dev((m, 1024), bfloat16), _weight("nvfp4", 512, 1024))
    assert _quant_launches(GB10_OPTIN, call) == _quant_launches(HOPPER_OPTIN, call)


def test_a_kernel_larger_than_the_device_allows_says_so():
    from atlas_cuda.kernels_loader import KernelLibrary
    lib = KernelLibrary.__new__(KernelLibrary)
    lib.backend, lib.kernels, lib.modules = _backend(GB10_OPTIN), {}, {}
    with pytest.raises(ValueError, match=r"attn_dec_mma_bf16_d128_h4 \(attention_decode_mma.cu\)"
                                         r" needs 110,848 bytes .* allows 101,376"):
        lib.kernel("attention_decode_mma", "bf16", "attn_dec_mma_bf16_d128_h4", 110848)
