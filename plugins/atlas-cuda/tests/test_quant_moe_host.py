"""Which kernels quantized decode MoE experts reach without a GPU (issue #22): the tensor-core
kernels of quant_moe_mma.cu where they serve (bf16 / f16 x, both K multiples of 128), the older
warp-per-column kernels of quant_moe.cu with policy ``quant_kernel=legacy`` or odd shapes, and
the launch arguments (grid, K split, scale indexing) the new kernels read."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from atlas_core.api import OpRegistry, QuantizedWeight, bfloat16, float8_e4m3fn
from atlas_core.api import quant_layout as layout
from atlas_cuda.ops import build_op_table
from atlas_cuda.policy import KernelPolicy
from atlas_cuda.quant_moe import QMOE2_DEPTH, mma_servable, qmoe_splits

from fake_context import FakeBackend, fake_context

SOURCE = Path(__file__).resolve().parents[3] / "kernels/cuda/common/quant_moe_mma.cu"


class Dev:
    """A device-array stand-in with an address (16-byte aligned unless told)."""

    def __init__(self, shape, dtype, ptr=1 << 20):
        self.shape, self.dtype, self.ptr = tuple(shape), np.dtype(dtype), ptr
        self.size = int(np.prod(self.shape))
        self.nbytes = self.size * self.dtype.itemsize


class DevBackend(FakeBackend):
    def empty(self, shape, dtype):
        return Dev(shape, dtype)


class DevWorkspace:
    def alloc(self, shape, dtype):
        return Dev(shape, dtype)


def _table(quant_kernel="auto"):
    ctx = fake_context(KernelPolicy(gemm="mma", quant_kernel=quant_kernel), backend=DevBackend())
    ctx.workspace = DevWorkspace()
    return ctx, build_op_table(ctx, OpRegistry.load())


def _weight(fmt, n, k, experts=128, block=(128, 128)):
    shape = (experts, n, k)
    block = block if fmt == "fp8_block" else None
    dtypes = {"data": np.uint8 if fmt == "nvfp4" else float8_e4m3fn,
              "scale": float8_e4m3fn if fmt == "nvfp4" else np.float32,
              "global_scale": np.float32}
    dev = {part: None if dims is None else Dev(dims, dtypes[part])
           for part, dims in layout(fmt, shape, block).items()}
    return QuantizedWeight(fmt, dev["data"], dev["scale"], shape, bfloat16, block,
                           dev["global_scale"])


def _experts(fmt, hidden=2048, inter=512, experts=256, block=(128, 128)):
    return (_weight(fmt, 2 * inter, hidden, experts, block),
            _weight(fmt, hidden, inter, experts, block))


def test_nvfp4_decode_takes_two_tensor_core_launches():
    """qwen3.5-35b-a3b's experts at batch 1: gate_up over (32 tiles x S) / 8 blocks x 8 pairs,
    down over (128 tiles x S) / 8 blocks x 1 token, each with its K split and h in bf16."""
    ctx, table = _table()
    gu, down = _experts("nvfp4")
    x, ids, wts = Dev((1, 2048), bfloat16), Dev((1, 8), np.int32), Dev((1, 8), np.float32)
    y = table.moe_experts(x, gu, down, wts, ids)
    assert y.shape == (1, 2048) and y.dtype == bfloat16
    (n1, g1, _, a1, pdl1), (n2, g2, _, a2, pdl2) = ctx.kernels.launches
    s1, s2 = qmoe_splits(32, 16, 8, 132), qmoe_splits(128, 32, 1, 132)
    assert (s1, s2) == (8, 8)
    assert n1 == f"qmoe2_gate_up_nvfp4_bf16_d{QMOE2_DEPTH['gate_up']}" and g1 == (32, 8)
    h = a1[0]
    assert h.shape == (8, 512) and h.dtype == bfloat16
    assert a1[1:] == (x, gu.data, gu.scale, gu.global_scale, wts, ids, 8, 2048, 512, 0, s1)
    assert n2 == f"qmoe2_down_nvfp4_bf16_d{QMOE2_DEPTH['down']}" and g2 == (128, 1)
    assert a2 == (y, h, down.data, down.scale, down.global_scale, wts, ids, 8, 2048, 512, s2)
    assert pdl1 == pdl2 == ctx.pdl


@pytest.mark.parametrize("fmt,tail,down_tail", [
    ("fp8_block", (128, 128, 16, 12 * 16), (128, 128, 6, 16 * 6)),
    ("fp8_channel", (1, 2048, 1, 1536), (1, 768, 1, 2048)),
    ("fp8_tensor", (1536, 2048, 0, 1), (2048, 768, 0, 1))])
def test_fp8_decode_passes_the_scale_indexing_and_gelu(fmt, tail, down_tail):
    """FP8 gate_up: after S come (bn, bk, s_row) and the expert stride of the scales (64-bit),
    as quant_moe.cu's kernels take them; gelu_tanh sets the activation flag."""
    ctx, table = _table()
    gu, down = _experts(fmt, inter=768, experts=128)
    ids, wts = Dev((3, 8), np.int32), Dev((3, 8), np.float32)
    table.moe_experts(Dev((3, 2048), np.float16), gu, down, wts, ids, "gelu_tanh")
    (n1, g1, _, a1, _), (n2, _, _, a2, _) = ctx.kernels.launches
    assert n1.startswith("qmoe2_gate_up_fp8_f16_d") and n2.startswith("qmoe2_down_fp8_f16_d")
    s = qmoe_splits(48, 16, 24, 132)
    assert a1[4:6] == (wts, ids)  # gate_up skips the pairs of weight 0 too
    assert g1 == (-(-48 * s // 8), 24) and a1[9] == 1 and a1[10] == s
    assert a1[11:] == tail and isinstance(a1[-1], np.int64)
    assert a2[6:10] == (8, 2048, 768, qmoe_splits(128, 8 * 6, 3, 132)) and a2[10:] == down_tail


def test_top_k_over_32_takes_the_warp_per_column_kernels():
    """qmoe2_down lists a token's slots of non-zero weight with one warp ballot."""
    ctx, table = _table()
    table.moe_experts(Dev((1, 2048), bfloat16), *_experts("nvfp4"), Dev((1, 33), np.float32),
                      Dev((1, 33), np.int32))
    assert [n for n, *_ in ctx.kernels.launches] == ["qmoe_gate_up_nvfp4_bf16",
                                                     "qmoe_down_nvfp4_bf16"]


def test_legacy_policy_keeps_the_warp_per_column_kernels():
    ctx, table = _table("legacy")
    table.moe_experts(Dev((2, 2048), bfloat16), *_experts("nvfp4"), Dev((2, 8), np.float32),
                      Dev((2, 8), np.int32))
    assert [n for n, *_ in ctx.kernels.launches] == ["qmoe_gate_up_nvfp4_bf16",
                                                     "qmoe_down_nvfp4_bf16"]


@pytest.mark.parametrize("hidden,inter,dtype,block", [
    (256, 96, bfloat16, (128, 128)),      # intermediate not whole 128-wide steps
    (2048 + 64, 512, bfloat16, (128, 128)),  # hidden not whole steps
    (2048, 512, np.float32, (128, 128)),  # f32 activations: no bf16 / f16 MMA
    (2048, 512, bfloat16, (128, 64))])    # FP8 blocks narrower than a step
def test_shapes_the_mma_kernels_cannot_take_fall_back(hidden, inter, dtype, block):
    ctx, table = _table()
    gu, down = _experts("fp8_block", hidden, inter, 8, block)
    x = Dev((1, hidden), dtype)
    assert not mma_servable(x, gu, down)
    table.moe_experts(x, gu, down, Dev((1, 2), np.float32), Dev((1, 2), np.int32))
    names = [n for n, *_ in ctx.kernels.launches]
    assert names[-2].startswith("qmoe_gate_up_fp8_") and names[-1].startswith("qmoe_down_fp8_")


def test_an_unaligned_activation_row_falls_back():
    gu, down = _experts("nvfp4")
    assert mma_servable(Dev((1, 2048), bfloat16), gu, down)
    assert not mma_servable(Dev((1, 2048), bfloat16, ptr=(1 << 20) + 8), gu, down)


def test_prefill_token_counts_still_dequantize():
    ctx, table = _table()
    gu, down = _experts("nvfp4", 256, 128, 8)
    table.moe_experts(Dev((9, 256), bfloat16), gu, down, Dev((9, 2), np.float32),
                      Dev((9, 2), np.int32))
    names = [n for n, *_ in ctx.kernels.launches]
    assert not any(n.startswith("qmoe") for n in names) and names[0].startswith("qdequant")


def test_moe_blocks_reach_the_tensor_core_experts():
    """moe_block and rms_norm_moe_block run unfused over the table: their experts are the
    same two qmoe2 launches (the router and top-k unchanged)."""
    ctx, table = _table()
    gu, down = _experts("fp8_block", experts=128, inter=768)
    x = Dev((1, 2048), bfloat16)
    table.moe_block(x, Dev((128, 2048), bfloat16), gu, down, 8, True)
    names = [n for n, *_ in ctx.kernels.launches]
    assert names[-2].startswith("qmoe2_gate_up_fp8_bf16") and names[-1].startswith("qmoe2_down")
    ctx.kernels.launches.clear()
    table.rms_norm_moe_block(x, x, Dev((2048,), bfloat16), 1e-6, False,
                             Dev((128, 2048), bfloat16), gu, down, 8, True)
    names = [n for n, *_ in ctx.kernels.launches]
    assert names[-2].startswith("qmoe2_gate_up_fp8_bf16") and names[-1].startswith("qmoe2_down")


@pytest.mark.parametrize("tiles,units,rows,want", [
    (32, 16, 8, 8),     # qwen3.5 gate_up, batch 1: 256 blocks with S 8
    (32, 16, 64, 4),    # batch 8: 64 pairs; 1024 blocks with S 4 reach 4 a SM
    (128, 32, 1, 8),    # qwen3.5 down, batch 1
    (128, 32, 8, 8),    # down, batch 8: 1024 blocks, four units a warp
    (48, 2, 8, 1),      # K of two steps: no split leaves each warp two
    (10_000, 64, 8, 1)])  # a grid already large
def test_k_split_fills_the_grid_but_keeps_work_per_warp(tiles, units, rows, want):
    assert qmoe_splits(tiles, units, rows, 132) == want


def test_every_kernel_the_host_names_is_instantiated():
    """QMOE2_DEPTH may only name depths QMOE2_ALL instantiates (a missing kernel would only
    show on the GPU, as a failed module lookup)."""
    text = SOURCE.read_text()
    for kind in ("gate_up", "down"):
        depths = {int(d) for d in re.findall(rf"QMOE2_{kind.upper()}\(T, S, (\d+)\)", text)}
        assert QMOE2_DEPTH[kind] in depths
        for fmt in ("fp8", "nvfp4"):
            assert f"qmoe2_{kind}_{fmt}_##S##_d##D" in text
