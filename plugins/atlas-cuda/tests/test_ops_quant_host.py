"""The cuda backend's quantized linears without a GPU: which kernels a QuantizedWeight reaches
through the op table (GEMV up to 8 rows, dequantize + GEMM above, the fused ops unfused), the
scale indexing the kernels use (checked against ``dequantize`` in NumPy), and the f16 bit
tricks ``quant_linear.cu`` decodes e4m3 / e2m1 codes with."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from atlas_core.api import OpRegistry, bfloat16, float8_e4m3fn
from atlas_core.api import E2M1_LUT, QuantizedWeight, dequantize, quantize
from atlas_core.api import quant_layout as layout
from atlas_cuda.ops import build_op_table
from atlas_cuda.ops_moe import MoeOps
from atlas_cuda.ops_quant import (SKINNY2_CONFIG, SKINNY_DEPTH, fp8_scale_args, gemv_splits, skinny2_smem,
                                  skinny_splits)
from atlas_cuda.policy import KernelPolicy
from atlas_cuda.quant_moe import QuantMoeOps

from fake_context import FakeBackend, fake_context

rng = np.random.default_rng(11)


class Dev:
    """A device-array stand-in with an address (16-byte aligned unless told)."""

    def __init__(self, shape, dtype, ptr=1 << 20):
        self.shape, self.dtype, self.ptr = tuple(shape), np.dtype(dtype), ptr
        self.size = int(np.prod(self.shape))
        self.nbytes = self.size * self.dtype.itemsize


class ScratchBackend(FakeBackend):
    def __init__(self):
        super().__init__()
        self.allocated = []

    def empty(self, shape, dtype):
        self.allocated.append(int(np.prod(shape)) * np.dtype(dtype).itemsize)
        return Dev(shape, dtype, ptr=len(self.allocated) << 32)


class DevWorkspace:
    def alloc(self, shape, dtype):
        return Dev(shape, dtype)


def _table(quant_kernel="legacy"):
    """An op table on a fake context; the older GEMV / skinny GEMM unless told
    (``quant_kernel="auto"``: the decode skinny kernel of quant_skinny.cu)."""
    ctx = fake_context(KernelPolicy(gemm="mma", quant_kernel=quant_kernel),
                       backend=ScratchBackend())
    ctx.workspace = DevWorkspace()
    return ctx, build_op_table(ctx, OpRegistry.load())


def _weight(fmt, n, k, lead=(), ptr=1 << 20):
    shape = (*lead, n, k)
    block = (128, 128) if fmt == "fp8_block" else None
    dtypes = {"data": np.uint8 if fmt == "nvfp4" else float8_e4m3fn,
              "scale": float8_e4m3fn if fmt == "nvfp4" else np.float32,
              "global_scale": np.float32}
    dev = {part: None if dims is None else Dev(dims, dtypes[part], ptr)
           for part, dims in layout(fmt, shape, block).items()}
    return QuantizedWeight(fmt, dev["data"], dev["scale"], shape, bfloat16, block,
                           dev["global_scale"])


def test_decode_rows_take_one_gemv_launch_reading_each_weight_once():
    ctx, table = _table()
    w = _weight("fp8_block", 1024, 4096)
    y = table.linear(Dev((1, 4096), bfloat16), w)
    assert y.shape == (1, 1024)
    (name, grid, _, args, pdl), = ctx.kernels.launches
    s = gemv_splits(1024, 4096, "fp8_block", 132)
    assert name == "qgemv_fp8_bf16_m1" and grid == 1024 * s // 8 and pdl
    assert args[-8:] == (1, 1024, 4096, 0, s, 128, 128, 32)


def test_nvfp4_rows_share_one_tile_and_pass_the_global_scale():
    ctx, table = _table()
    w = _weight("nvfp4", 512, 2048)
    table.linear(Dev((2, 2048), bfloat16), w)
    (name, _, _, args, _), = ctx.kernels.launches
    assert name == "qgemv_nvfp4_bf16_m2"
    assert args[2] is w.data and args[3] is w.scale and args[4] is w.global_scale


@pytest.mark.parametrize("m,mt", [(9, 1), (16, 1), (17, 2), (33, 4), (64, 4)])
def test_up_to_64_rows_take_the_skinny_tensor_core_gemm(m, mt):
    ctx, table = _table()
    table.linear(Dev((m, 4096), bfloat16), _weight("fp8_block", 4096, 4096))
    table.linear(Dev((m, 1024), bfloat16), _weight("nvfp4", 512, 1024))
    (fp8, grid, _, args, pdl), (fp4, grid4, *_) = ctx.kernels.launches
    assert fp8 == f"qgemm_fp8_bf16_m{mt}_n2" and grid == 4096 // 16 and pdl
    assert args[-7:] == (m, 4096, 4096, 0, 128, 128, 32)
    assert fp4 == f"qgemm_nvfp4_bf16_m{mt}_n1" and grid4 == 512 // 8


def test_the_gemms_k_permutation_is_a_plain_dot_product():
    """quant_gemm.cu feeds mma.sync m16n8k16 with lane (g, t) holding K elements
    [E t, E t + E) of a slab; emulate the MMA from its documented fragments and compare."""
    for e in (16, 32):
        slab = 4 * e
        x = rng.standard_normal((16, slab))
        w = rng.standard_normal((8, slab))
        acc = np.zeros((16, 8))
        for st in range(e // 4):
            a = np.zeros((16, 16))
            b = np.zeros((16, 8))
            for lane in range(32):
                g, t = divmod(lane, 4)
                phys = [e * t + 4 * st + q for q in (0, 1, 2, 3)]
                for q, kk in zip((0, 1, 8, 9), phys):
                    a[g, 2 * t + q], a[g + 8, 2 * t + q] = x[g, kk], x[g + 8, kk]
                    b[2 * t + q, g] = w[g, kk]
            acc += a @ b
        np.testing.assert_allclose(acc, x @ w.T, rtol=1e-12, atol=1e-12)


def test_more_rows_dequantize_into_a_reused_scratch_then_run_the_gemm():
    ctx, table = _table()
    w = _weight("nvfp4", 256, 512)
    table.linear(Dev((65, 512), bfloat16), w)
    table.linear(Dev((65, 512), bfloat16), w)
    names = [launch[0] for launch in ctx.kernels.launches]
    assert names == ["qdequant32_nvfp4_bf16", "gemm_bf16_64x128"] * 2
    assert ctx.backend.allocated == [256 * 512 * 2], "one scratch buffer, reused"


def test_shapes_the_gemv_cannot_take_go_through_the_dequantize_path():
    ctx, table = _table()
    table.linear(Dev((1, 48), bfloat16), _weight("nvfp4", 64, 48))
    table.linear(Dev((1, 64), bfloat16, ptr=8), _weight("fp8_channel", 64, 64))
    names = [launch[0] for launch in ctx.kernels.launches]
    assert names[0] == "qdequant_nvfp4_bf16", "K = 48: the scalar dequantization"
    assert "qdequant16_fp8_bf16" in names
    assert not any(n.startswith("qgemv") for n in names)


def test_fused_ops_with_quantized_weights_run_unfused_over_the_quantized_linear():
    ctx, table = _table()
    x = Dev((1, 1024), bfloat16)
    table.rms_norm_linear(x, None, Dev((1024,), bfloat16), 1e-6, _weight("fp8_tensor", 256, 1024))
    table.linear_act_and_mul(x, _weight("fp8_channel", 512, 1024))
    names = [launch[0] for launch in ctx.kernels.launches]
    assert names == ["rms_norm_bf16", "qgemv_fp8_bf16_m1", "qgemv_fp8_bf16_m1",
                     "silu_and_mul_bf16"]


@pytest.mark.parametrize("m,fused", [(1, True), (2, True), (3, False), (9, False)])
def test_the_skinny_kernel_takes_the_pre_norm_of_up_to_2_rows(m, fused):
    """rms_norm_linear over a quantized weight (policy auto): one ``qskinny*_norm_*`` launch
    for 1-2 rows (then the activation's act_and_mul), rms_norm then the projection after."""
    ctx, table = _table("auto")
    x, nw = Dev((m, 1024), bfloat16), Dev((1024,), bfloat16)
    table.rms_norm_linear(x, Dev((m, 1024), bfloat16), nw, 1e-6, _weight("fp8_block", 256, 1024))
    table.rms_norm_linear(x, None, nw, 1e-6, _weight("nvfp4", 512, 1024), activation="silu")
    names = [launch[0] for launch in ctx.kernels.launches]
    if fused:
        assert len(names) == 3 and "_norm_fp8_" in names[0] and "_norm_nvfp4_" in names[1]
        assert names[2] == "silu_and_mul_bf16"
        assert ctx.kernels.launches[0][3][-5] is not None  # the summed residual's output
    else:
        assert names[0] == "rms_norm_bf16"
        assert not any(n.startswith("qskinny") and "_norm_" in n for n in names)


def test_decode_experts_read_only_the_chosen_rows_in_two_launches():
    ctx, table = _table()
    gu, down = _weight("nvfp4", 1536, 2048, (128,)), _weight("nvfp4", 2048, 768, (128,))
    ids, wts = Dev((2, 8), np.int32), Dev((2, 8), np.float32)
    y = table.moe_experts(Dev((2, 2048), bfloat16), gu, down, wts, ids)
    assert y.shape == (2, 2048)
    (n1, g1, _, a1, _), (n2, g2, _, a2, _) = ctx.kernels.launches
    assert (n1, g1) == ("qmoe_gate_up_nvfp4_bf16", (768 // 8, 16))
    assert a1[2:7] == (gu.data, gu.scale, gu.global_scale, wts, ids)
    assert a1[7:] == (8, 2048, 768, 0)
    assert (n2, g2) == ("qmoe_down_nvfp4_bf16", (2048 // 8, 2))
    fp8 = _weight("fp8_block", 1536, 2048, (128,)), _weight("fp8_block", 2048, 768, (128,))
    table.moe_experts(Dev((1, 2048), bfloat16), *fp8, wts, ids, "gelu_tanh")
    name, _, _, args, _ = ctx.kernels.launches[2]
    assert name == "qmoe_gate_up_fp8_bf16"
    assert args[-5:] == (1, 128, 128, 16, 12 * 16)


def test_prefill_experts_are_dequantized_into_their_own_slots():
    ctx, _ = _table()
    seen = {}

    class Moe:
        def moe_experts(self, x, w_gate_up, w_down, topk_weights, topk_ids, activation):
            seen.update(gate_up=w_gate_up, down=w_down)

    ctx._parts[MoeOps] = Moe()
    ctx.bind(QuantMoeOps).moe_experts(Dev((9, 256), bfloat16),
                                      _weight("fp8_block", 256, 256, (8,)),
                                      _weight("nvfp4", 256, 128, (8,)), None, None)
    assert seen["gate_up"].shape == (8, 256, 256) and seen["down"].shape == (8, 256, 128)
    assert seen["gate_up"].ptr != seen["down"].ptr
    assert [n for n, *_ in ctx.kernels.launches] == ["qdequant16_fp8_bf16",
                                                     "qdequant32_nvfp4_bf16"]


def test_moe_blocks_with_quantized_experts_run_unfused():
    ctx, table = _table()
    x = Dev((1, 2048), bfloat16)
    gu, down = _weight("fp8_block", 1536, 2048, (128,)), _weight("fp8_block", 2048, 768, (128,))
    table.moe_block(x, Dev((128, 2048), bfloat16), gu, down, 8, True)
    names = [n for n, *_ in ctx.kernels.launches]
    assert names[-2:] == ["qmoe_gate_up_fp8_bf16", "qmoe_down_fp8_bf16"]
    assert not any(n.startswith("qdequant") for n in names)


def test_a_linear_refuses_a_stack_and_a_wrong_width():
    _, table = _table()
    with pytest.raises(ValueError, match="stack"):
        table.linear(Dev((1, 64), bfloat16), _weight("fp8_tensor", 64, 64, (2,)))
    with pytest.raises(ValueError, match="32 columns"):
        table.linear(Dev((1, 32), bfloat16), _weight("fp8_tensor", 64, 64))


@pytest.mark.parametrize("fmt", ["fp8_tensor", "fp8_channel", "fp8_block"])
@pytest.mark.parametrize("lead", [(), (3,)])
def test_fp8_scale_index_reproduces_dequantize(fmt, lead):
    *_, n, k = shape = (*lead, 200, 272)
    w = quantize(rng.standard_normal(shape).astype(np.float32), fmt, block_size=(128, 64))
    bn, bk, s_row, s_lead = fp8_scale_args(w)
    e, nn, kk = np.meshgrid(np.arange(int(np.prod(lead or (1,)))), np.arange(n), np.arange(k),
                            indexing="ij")
    idx = e * s_lead + (nn // bn) * s_row + kk // bk
    got = w.data.astype(np.float32).reshape(-1, n, k) * np.asarray(w.scale).reshape(-1)[idx]
    np.testing.assert_array_equal(got.reshape(shape), dequantize(w))


def test_kernel_code_decoders_match_the_formats():
    codes = np.arange(256, dtype=np.uint32)
    bits = ((codes & 0x7F) << 7) | ((codes & 0x80) << 8)
    as_f16 = bits.astype(np.uint16).view(np.float16).astype(np.float32) * 256
    want = codes.astype(np.uint8).view(float8_e4m3fn).astype(np.float32)
    finite = ~np.isnan(want)
    np.testing.assert_array_equal(as_f16[finite], want[finite])
    nib = np.arange(16, dtype=np.uint32)
    e2m1 = (((nib & 7) << 9) | ((nib & 8) << 12)).astype(np.uint16).view(np.float16)
    np.testing.assert_array_equal(e2m1.astype(np.float32) * 16384, E2M1_LUT)


def test_splits_keep_two_blocks_per_sm_without_starving_lanes():
    assert gemv_splits(151936, 4096, "fp8_block", 132) == 1
    assert gemv_splits(1024, 4096, "fp8_block", 132) == 4
    assert gemv_splits(1024, 1024, "nvfp4", 132) == 1


def test_a_target_with_the_fp4_mma_on_runs_nvfp4_prefill_there_once_swizzled():
    ctx, table = _table()
    ctx.kernels.target = SimpleNamespace(hardware={"quant": {"fp4_mma": True},
                                                   "module_arch": {"nvfp4_mma": "sm_121a"}})
    w = _weight("nvfp4", 256, 512)
    for _ in range(2):
        table.linear(Dev((100, 512), bfloat16), w)
    table.linear(Dev((100, 512), bfloat16), _weight("fp8_block", 256, 512))
    names = [launch[0] for launch in ctx.kernels.launches]
    assert names == ["nvfp4_swizzle_scales", "nvfp4_act_quant_bf16", "nvfp4_gemm_bf16",
                     "nvfp4_act_quant_bf16", "nvfp4_gemm_bf16", "qdequant16_fp8_bf16",
                     "gemm_bf16_64x128"]
    gemm = ctx.kernels.launches[2]
    assert gemm[1] == (256 // 32, -(-100 // 16))


def test_the_fp4_mma_stays_off_where_the_target_says_so():
    target = pytest.importorskip("atlas_gb10").target
    ctx, table = _table()
    ctx.kernels.target = target()
    table.linear(Dev((100, 512), bfloat16), _weight("nvfp4", 256, 512))
    assert ctx.kernels.launches[0][0] == "qdequant32_nvfp4_bf16"


@pytest.mark.parametrize("rows,m,want", [(8, 4, "qgemv_fp8_bf16_m4"), (2, 2, "qgemv_fp8_bf16_m2"),
                                         (2, 3, "qgemm_fp8_bf16_m1_n2"),
                                         (1, 2, "qgemm_fp8_bf16_m1_n2")])
def test_policy_gemv_rows_moves_the_crossover_to_the_skinny_gemm(rows, m, want):
    """``gemv_rows`` (``ATLAS_CUDA_GEMV_ROWS``): rows above it take the tensor-core GEMM, for
    quantized weights as for dense ones (the dense linear's cuBLASLt / mma path)."""
    ctx, table = _table()
    ctx.set_policy(KernelPolicy(gemm="mma", gemv_rows=rows, quant_kernel="legacy"))
    table.linear(Dev((m, 4096), bfloat16), _weight("fp8_block", 4096, 4096))
    table.linear(Dev((m, 4096), bfloat16), Dev((4096, 4096), bfloat16))
    (quant, *_), (dense, *_) = ctx.kernels.launches
    assert quant == want
    assert dense.startswith("gemvn_" if m <= rows else "gemm_bf16_")


@pytest.mark.parametrize("m,nt", [(1, 1), (8, 1), (9, 2), (16, 2), (17, 4), (33, 8), (64, 8)])
def test_decode_rows_take_one_skinny_launch_by_default(m, nt):
    """1-64 rows: one skinny launch; ``qskinny2_*`` (MT, depth) where SKINNY2_CONFIG names
    one, with a grid of ``16 MT``-row tiles times the K split over 8 warps, else the
    register-ring ``qskinny_*`` of depth SKINNY_DEPTH."""
    ctx, table = _table("auto")
    table.linear(Dev((m, 4096), bfloat16), _weight("fp8_block", 4096, 4096))
    table.linear(Dev((m, 1024), bfloat16), _weight("nvfp4", 512, 1024))
    launches = ctx.kernels.launches
    assert len(launches) == 2 and launches[0][4]
    for (name, grid, _, args, _), fmt, (n, k) in zip(launches, ("fp8", "nvfp4"),
                                                     ((4096, 4096), (512, 1024))):
        cfg = SKINNY2_CONFIG.get((fmt, nt))
        if cfg is None:
            s = skinny_splits(n, k, 132)
            assert name == f"qskinny_{fmt}_bf16_n{nt}_d{SKINNY_DEPTH.get((fmt, nt), 1)}"
            assert grid == -(-(n // 16) * s // 8)
        else:
            mt, d = cfg
            s = skinny_splits(n, k, 132, 16 * mt)
            assert name == f"qskinny2_{fmt}_bf16_n{nt}_m{mt}_d{d}"
            assert grid == -(-(-(-n // (16 * mt))) * s // 8)
        tail = (m, n, k, s, 128, 128, 32) if fmt == "fp8" else (m, n, k, s)
        assert args[-len(tail):] == tail


def test_skinny2_ring_and_reduction_fit_shared_memory():
    """Every configured ring (and the K-split reduction reusing it) fits a Hopper block's
    227 KiB of dynamic shared memory."""
    for (fmt, nt), (mt, d) in SKINNY2_CONFIG.items():
        assert skinny2_smem(fmt, nt, mt, d, 2) <= 227 << 10
        assert skinny2_smem(fmt, nt, mt, d, 1) == 8 * d * mt * 2 * (1 if fmt == "nvfp4" else 2) * 512


def test_shapes_the_skinny_kernel_cannot_take_fall_back():
    ctx, table = _table("auto")
    table.linear(Dev((1, 4096), np.float32), _weight("fp8_block", 256, 4096))  # f32 x
    table.linear(Dev((2, 1088), bfloat16), _weight("nvfp4", 64, 1088))  # K % 128
    table.linear(Dev((1, 4096), bfloat16), _weight("fp8_block", 64, 4096, ptr=8))  # unaligned
    table.linear(Dev((65, 4096), bfloat16), _weight("fp8_block", 64, 4096))  # > 64 rows
    names = [launch[0] for launch in ctx.kernels.launches]
    assert not any(n.startswith("qskinny") for n in names), names


def test_skinny_splits_fill_the_gpu_but_keep_two_steps_a_warp():
    assert skinny_splits(4096, 4096, 132) == 8
    assert skinny_splits(24576, 4096, 132) == 2
    assert skinny_splits(151936, 4096, 132) == 1
    assert skinny_splits(4096, 256, 132) == 1


def _f16_bits(bits):
    return np.asarray(bits, np.uint32).astype(np.uint16).view(np.float16).astype(np.float64)


def _bf16_bits(bits):
    return (np.asarray(bits, np.uint32) << 16).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_skinny_integer_decoders_carry_a_known_power_of_two(kind):
    """quant_skinny.cu's fp8_pair / fp4_pair: the magnitude shifted into T's exponent and
    mantissa, the sign to bit 15, worth the code times 2^-120 / 2^-126 (bf16) or 2^-8 / 2^-14
    (f16), subnormal codes included."""
    sh8, sh4, off8, off4, view = ((4, 6, 120, 126, _bf16_bits) if kind == "bf16"
                                  else (7, 9, 8, 14, _f16_bits))
    codes = np.arange(256, dtype=np.uint32)
    got = view(((codes & 0x7F) << sh8) | ((codes & 0x80) << 8)) * 2.0 ** off8
    want = codes.astype(np.uint8).view(float8_e4m3fn).astype(np.float64)
    finite = ~np.isnan(want)
    np.testing.assert_array_equal(got[finite], want[finite])
    nib = np.arange(16, dtype=np.uint32)
    got4 = view(((nib & 7) << sh4) | ((nib & 8) << 12)) * 2.0 ** off4
    np.testing.assert_array_equal(got4, E2M1_LUT)


def _skinny_fragments(fmt, w_rows, x_rows):
    """The A (weight, 16 x 16) and B (x, 16 x 8) tiles quant_skinny.cu hands mma.sync per
    substep for one 128-wide K step, built from the lanes' registers as the kernel fills them:
    lane (g, t) owns 32 codes of rows g and g + 8 (NVFP4 [32 t, 32 t + 32), FP8 16 at 16 t and
    16 at 64 + 16 t); FP8 substep st pairs codes
    4 st + {0, 2} (fragment columns 2t, 2t + 1) and 4 st + {1, 3} (2t + 8, 2t + 9), NVFP4 substep
    st codes 8 (st // 2) + 2 (st % 2) + {0, 4} and + {1, 5}."""
    for st in range(8):
        a, b = np.zeros((16, 16)), np.zeros((16, 8))
        for lane in range(32):
            g, t = divmod(lane, 4)
            if fmt == "fp8":
                lo, hi = [4 * st, 4 * st + 2], [4 * st + 1, 4 * st + 3]
            else:
                base = 8 * (st // 2) + 2 * (st % 2)
                lo, hi = [base, base + 4], [base + 1, base + 5]
            for cols, phys in (((2 * t, 2 * t + 1), lo), ((2 * t + 8, 2 * t + 9), hi)):
                for c, p in zip(cols, phys):
                    # FP8 chunk c = p // 16 at K 16 t + 64 c (quant_common.cuh qchunk_offset)
                    kk = 32 * t + p if fmt == "nvfp4" else 16 * t + 64 * (p // 16) + p % 16
                    a[g, c], a[g + 8, c] = w_rows[g, kk], w_rows[g + 8, kk]
                    b[c, g] = x_rows[g, kk]
        yield a, b


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_skinny_k_permutation_is_a_plain_dot_product(fmt):
    w = rng.standard_normal((16, 128))
    x = rng.standard_normal((8, 128))
    acc = sum(a @ b for a, b in _skinny_fragments(fmt, w, x))
    np.testing.assert_allclose(acc, w @ x.T, rtol=1e-12, atol=1e-12)
