"""Quantized linears on the GPU against the NumPy references (dequantize, then compute): the
W8A16 / W4A16 GEMVs (1-8 rows), the dequantize + GEMM path (more rows, odd shapes), the fused
ops over quantized weights, quantized MoE experts, and the device fill of random codes."""

import numpy as np
import pytest

from atlas_core.api import bfloat16, float8_e4m3fn
from atlas_core.api import reference as ref
from atlas_core.api import QuantizedWeight, quantize
from cuda_probe import device_rel_error as rel

pytestmark = pytest.mark.gpu
rng = np.random.default_rng(5)
FORMATS = ["fp8_block", "fp8_tensor", "fp8_channel", "nvfp4"]
#: bf16 outputs of a bf16 reference computed from the same dequantized weight.
TOL = 1e-2


def upload(be, q: QuantizedWeight) -> QuantizedWeight:
    """The device copy of a host quantized weight, as the loader makes it."""
    dev = {k: None if a is None else be.from_host(np.asarray(a, order="C"))
           for k, a in (("data", q.data), ("scale", np.asarray(q.scale)),
                        ("global_scale", q.global_scale))}
    return q.replace(**dev)


def qweight(fmt, n, k, lead=(), dtype=bfloat16):
    w = rng.standard_normal((*lead, n, k)).astype(np.float32) * k ** -0.5
    return quantize(w, fmt, dtype=dtype)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,n,k", [(1, 1024, 4096), (3, 72, 2048), (8, 256, 1024),
                                   (9, 128, 512), (64, 384, 1024), (2, 64, 784)])
def test_linear(cuda_backend, fmt, m, n, k):
    if fmt == "nvfp4" and k % 16:
        pytest.skip("nvfp4 needs K % 16")
    be = cuda_backend
    q = qweight(fmt, n, k)
    x, b = rng.standard_normal((m, k)).astype(bfloat16), rng.standard_normal(n).astype(bfloat16)
    y = be.ops.linear(be.from_host(x), upload(be, q), be.from_host(b))
    assert rel(be, y, ref.linear(x, q, b)) < TOL


@pytest.mark.parametrize("fmt", ["fp8_block", "nvfp4"])
def test_f32_activations(cuda_backend, fmt):
    be = cuda_backend
    q = qweight(fmt, 128, 1024, dtype=np.float32)
    x = rng.standard_normal((2, 1024)).astype(np.float32)
    y = be.ops.linear(be.from_host(x), upload(be, q))
    assert rel(be, y, ref.linear(x, q)) < 1e-5


@pytest.mark.parametrize("fmt", ["fp8_block", "nvfp4"])
@pytest.mark.parametrize("m", [1, 5, 33])
def test_rms_norm_linear_and_gated_mlp(cuda_backend, fmt, m):
    be = cuda_backend
    k = 1024
    x, r = (rng.standard_normal((m, k)).astype(bfloat16) for _ in range(2))
    nw = (1 + 0.1 * rng.standard_normal(k)).astype(bfloat16)
    q, gu = qweight(fmt, 256, k), qweight(fmt, 512, k)
    y, r_out = be.ops.rms_norm_linear(be.from_host(x), be.from_host(r), be.from_host(nw), 1e-6,
                                      upload(be, q))
    want_y, want_r = ref.rms_norm_linear(x, r, nw, 1e-6, q)
    assert rel(be, y, want_y) < TOL and rel(be, r_out, want_r) < 1e-2
    g = be.ops.linear_act_and_mul(be.from_host(x), upload(be, gu))
    assert rel(be, g, ref.linear_act_and_mul(x, gu)) < TOL


@pytest.mark.parametrize("fmt", ["fp8_block", "fp8_tensor", "nvfp4"])
@pytest.mark.parametrize("m,k,residual,zc,act", [(1, 4096, True, False, None),
                                                 (2, 4096, False, True, "silu"),
                                                 (8, 4096, False, True, "silu"),
                                                 (3, 2048, True, False, "gelu_tanh"),
                                                 (2, 12288, True, True, None)])
def test_fused_norm_skinny_prologue(cuda_backend, fmt, m, k, residual, zc, act):
    """1-2 rows: rms_norm_linear is one qskinny*_norm_* launch (more: rms_norm first) whose blocks normalise x
    (+ residual) themselves; y, the summed residual (written by block 0 only) and the
    gated activation after it match the reference, with and without a residual and for
    zero-centred norm weights, at K up to 12,288 (several K splits)."""
    be = cuda_backend
    x = rng.standard_normal((m, k)).astype(bfloat16)
    r = rng.standard_normal((m, k)).astype(bfloat16) if residual else None
    nw = (1 + 0.1 * rng.standard_normal(k)).astype(bfloat16)
    q = qweight(fmt, 512 if act else 384, k)
    y, r_out = be.ops.rms_norm_linear(be.from_host(x), None if r is None else be.from_host(r),
                                      be.from_host(nw), 1e-6, upload(be, q), None, zc, act)
    want_y, want_r = ref.rms_norm_linear(x, r, nw, 1e-6, q, None, zc, act)
    assert rel(be, y, want_y) < TOL and rel(be, r_out, want_r) < 1e-2


@pytest.mark.parametrize("fmt", ["fp8_block", "fp8_channel", "nvfp4"])
@pytest.mark.parametrize("t", [1, 4, 8, 12])
def test_moe_experts(cuda_backend, fmt, t):
    be = cuda_backend
    e, hidden, inter, top = 8, 256, 128, 2
    gu, down = qweight(fmt, 2 * inter, hidden, (e,)), qweight(fmt, hidden, inter, (e,))
    x = rng.standard_normal((t, hidden)).astype(bfloat16)
    ids = np.stack([rng.choice(e, top, replace=False) for _ in range(t)]).astype(np.int32)
    wts = rng.random((t, top)).astype(np.float32)
    y = be.ops.moe_experts(be.from_host(x), upload(be, gu), upload(be, down), be.from_host(wts),
                           be.from_host(ids))
    assert rel(be, y, ref.moe_experts(x, gu, down, wts, ids)) < 2e-2


@pytest.mark.parametrize("fmt", ["fp8_block", "nvfp4"])
def test_moe_block_with_a_quantized_shared_expert(cuda_backend, fmt):
    be = cuda_backend
    e, hidden, inter = 8, 256, 128
    x = rng.standard_normal((3, hidden)).astype(bfloat16)
    router = (rng.standard_normal((e, hidden)) * 0.1).astype(bfloat16)
    gu, down = qweight(fmt, 2 * inter, hidden, (e,)), qweight(fmt, hidden, inter, (e,))
    sgu, sdown = qweight(fmt, 2 * inter, hidden), qweight(fmt, hidden, inter)
    gate = (rng.standard_normal((1, hidden)) * 0.1).astype(bfloat16)
    y = be.ops.moe_block(be.from_host(x), be.from_host(router), upload(be, gu), upload(be, down),
                         2, True, shared_gate_up=upload(be, sgu), shared_down=upload(be, sdown),
                         shared_gate=be.from_host(gate))
    want = ref.moe_block(x, router, gu, down, 2, True, shared_gate_up=sgu, shared_down=sdown,
                         shared_gate=gate)
    assert rel(be, y, want) < 2e-2


def test_device_fill_of_random_codes(cuda_backend):
    be = cuda_backend
    codes = be.empty((1 << 16,), float8_e4m3fn)
    be.fill_random(codes, 3, 1.0, 0.0)
    vals = be.to_host(codes).astype(np.float32)
    assert np.all(np.isfinite(vals)) and 0.9 < vals.std() < 1.1
    raw = be.empty((1 << 16,), np.uint8)
    be.fill_random(raw, 4, 0.0, 0.0)
    assert len(np.unique(be.to_host(raw))) == 256


def _one_hot_rows(m, k, dtype):
    """``m`` rows of x, row i selecting weight column ``(37 * i) % k``: y[i] is then exactly a
    column of the dequantized weight (times 1.0), so any decode error shows bit for bit."""
    x = np.zeros((m, k), dtype)
    x[np.arange(m), (37 * np.arange(m)) % k] = 1
    return x


@pytest.mark.parametrize("dtype", [bfloat16, np.float16])
@pytest.mark.parametrize("m", [1, 7, 8, 20, 64])
def test_skinny_decodes_every_fp8_code_exactly(cuda_backend, dtype, m):
    """All 254 finite e4m3 codes (subnormals included) through the skinny kernel's integer
    decode and its power-of-two fix-up, with a power-of-two scale: exact."""
    be = cuda_backend
    n, k = 32, 256
    codes = np.arange(n * k) % 256
    codes = np.where((codes & 0x7f) == 0x7f, 0, codes).astype(np.uint8)  # no NaN codes
    rng.shuffle(codes)
    data = codes.reshape(n, k).view(float8_e4m3fn)
    q = QuantizedWeight("fp8_channel", data, np.full(n, 0.25, np.float32), (n, k), dtype)
    x = _one_hot_rows(m, k, dtype)
    y = be.to_host(be.ops.linear(be.from_host(x), upload(be, q))).astype(np.float32)
    want = np.asarray(ref.linear(x, q), np.float32)
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("dtype", [bfloat16, np.float16])
@pytest.mark.parametrize("m", [1, 9, 64])
def test_skinny_decodes_every_nvfp4_code_exactly(cuda_backend, dtype, m):
    """Every byte (two e2m1 codes) under e4m3 group scales from subnormal to 448 and a
    power-of-two global scale: the products are exact in bf16 and f16, so is the result."""
    be = cuda_backend
    n, k = 48, 512
    data = (np.arange(n * k // 2) % 256).astype(np.uint8)
    rng.shuffle(data)
    scale_codes = rng.integers(1, 0x7f, (n, k // 16)).astype(np.uint8)  # finite, > 0
    q = QuantizedWeight("nvfp4", data.reshape(n, k // 2), scale_codes.view(float8_e4m3fn),
                        (n, k), dtype, (1, 16), np.asarray(2.0 ** -9, np.float32))
    x = _one_hot_rows(m, k, dtype)
    y = be.to_host(be.ops.linear(be.from_host(x), upload(be, q))).astype(np.float32)
    want = np.asarray(ref.linear(x, q), np.float32)
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("fmt", ["fp8_block", "nvfp4"])
def test_prefill_rows_dequantize_every_code_exactly(cuda_backend, fmt):
    """More than 64 rows take the vector dequantization (16-byte loads of codes) and the dense
    GEMM: one-hot rows of x read columns of the dequantized weight back, bit for bit."""
    be = cuda_backend
    n, k = 64, 512
    if fmt == "nvfp4":
        data = (np.arange(n * k // 2) % 256).astype(np.uint8).reshape(n, k // 2)
        scales = rng.integers(1, 0x7f, (n, k // 16)).astype(np.uint8).view(float8_e4m3fn)
        q = QuantizedWeight("nvfp4", data, scales, (n, k), bfloat16, (1, 16),
                            np.asarray(2.0 ** -9, np.float32))
    else:
        codes = (np.arange(n * k) % 256).astype(np.uint8)
        codes = np.where((codes & 0x7f) == 0x7f, 0, codes).astype(np.uint8)
        q = QuantizedWeight("fp8_block", codes.reshape(n, k).view(float8_e4m3fn),
                            np.full((1, 4), 0.5, np.float32), (n, k), bfloat16, (128, 128))
    x = _one_hot_rows(80, k, bfloat16)
    y = be.to_host(be.ops.linear(be.from_host(x), upload(be, q))).astype(np.float32)
    np.testing.assert_array_equal(y, np.asarray(ref.linear(x, q), np.float32))
