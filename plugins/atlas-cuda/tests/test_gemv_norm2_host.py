"""``GemvOps.norm2_gemv`` (Gemma's ``ffn_in`` as one ``gemvn_norm2_act`` kernel) without a GPU:
the kernel name and tile, its arguments in the kernel's order, and the operands it refuses (the
caller then composes the separate ops); results: plugins/atlas-gemma4/tests/test_gemma4_cuda.py."""

from types import SimpleNamespace

import numpy as np
import pytest

from atlas_core.api import bfloat16
from atlas_cuda.ops_gemv import NORM_ONE_PASS_K, GemvOps, gemv_tile
from atlas_cuda.policy import KernelPolicy
from fake_context import fake_context


def _arr(shape, dtype=bfloat16, ptr=0):
    return SimpleNamespace(shape=tuple(shape), dtype=np.dtype(dtype), ptr=ptr,
                           size=int(np.prod(shape)))


def _operands(rows=1, d=2816, inter=2112, dtype=bfloat16, experts=True):
    """x, residual, x_weight, norm_weight, norm2_weight, weight, bias, activation."""
    w = _arr((d,), dtype)
    return (_arr((rows, d), dtype), _arr((rows, d), dtype), w, w, w if experts else None,
            _arr((2 * inter, d), dtype), None, "gelu_tanh")


def test_one_row_is_one_launch_with_the_kernel_s_argument_order():
    ctx = fake_context()
    ops = GemvOps(ctx)
    x, res, xw, nw, nw2, w, bias, act = _operands()
    assert ops.norm2_gemv_fusable(x, res, xw, nw, nw2, w, bias, act)
    y, r, h2 = ops.norm2_gemv(x, res, xw, nw, nw2, 1e-6, w, bias, True, act)
    [(name, grid, shmem, args, pdl)] = ctx.kernels.launches
    _, s = gemv_tile(2112, 2816, fused_norm=True, pair=True)
    assert name == "gemvn_norm2_act_bf16_m1_g1" and pdl and shmem == 2816 * 2
    assert grid == -(-2112 // (8 // s))
    assert y.shape == (1, 2112) and r.shape == h2.shape == (1, 2816)
    # y, r, h2, x, res, xnw, nw, nw2, eps, zc, w, bias, M, N, K, m0, s, pf, gelu
    assert args[:8] == (y, r, h2, x, res, xw, nw, nw2)
    assert args[8:] == (1e-6, 1, w, None, 1, 2112, 2816, 0, s, 0, 1)
    ops.norm2_gemv(x, res, xw, nw, None, 1e-6, w, bias, False, "silu")
    args = ctx.kernels.launches[-1][3]
    assert args[2] is None and args[7] is None and args[9] == 0 and args[-1] == 0


def test_rows_up_to_gemv_rows_take_their_row_tile():
    ctx = fake_context(KernelPolicy(gemv_rows=8))
    ops = GemvOps(ctx)
    for rows, tile in ((2, 2), (3, 4), (8, 8)):
        operands = _operands(rows)
        assert ops.norm2_gemv_fusable(*operands)
        x, res, xw, nw, nw2, w, bias, act = operands
        ops.norm2_gemv(x, res, xw, nw, nw2, 1e-6, w, bias, False, act)
        name, _, shmem, *_ = ctx.kernels.launches[-1]
        assert name == f"gemvn_norm2_act_bf16_m{tile}_g1" and shmem == tile * 2816 * 2
    # float32 has the one-row kernel only
    assert ops.norm2_gemv_fusable(*_operands(1, dtype=np.float32))
    assert not ops.norm2_gemv_fusable(*_operands(2, dtype=np.float32))


@pytest.mark.parametrize("change", ["rows", "no-residual", "quantized", "plain", "wide",
                                    "x-weight-dtype", "experts-align", "no-x-weight"])
def test_refused_operands(change):
    """What the fused kernel does not serve: more rows than ``gemv_rows`` (1), no residual, a
    quantized weight, no activation, K past the one-pass prologue, a norm weight in another
    dtype or off 16 bytes."""
    from atlas_cuda.ops_quant import QuantizedWeight

    ops = GemvOps(fake_context())
    x, res, xw, nw, nw2, w, bias, act = _operands(2 if change == "rows" else 1,
                                                  NORM_ONE_PASS_K + 8 if change == "wide"
                                                  else 2816)
    if change == "no-residual":
        res = None
    elif change == "quantized":
        w = QuantizedWeight.__new__(QuantizedWeight)
    elif change == "plain":
        act = None
    elif change == "x-weight-dtype":
        xw = _arr(xw.shape, np.float32)
    elif change == "experts-align":
        nw2 = _arr(nw2.shape, ptr=8)
    elif change == "no-x-weight":
        xw = None
    assert not ops.norm2_gemv_fusable(x, res, xw, nw, nw2, w, bias, act)
