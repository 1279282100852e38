"""Quantized weights in the op contract: layouts, exact dequantization, the references and the
numpy backend's weight cache."""

import ml_dtypes
import numpy as np
import pytest

from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.ops import reference as ref
from atlas_core.ops.quant import (E2M1_VALUES, FORMATS, QuantizedWeight, dequantize, quantize,
                                  unpack_e2m1)

FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


def _loop_dequantize(qw: QuantizedWeight) -> np.ndarray:
    """Element by element, straight from the layout table of atlas_core.ops.quant."""
    *lead, n, k = qw.shape
    out = np.empty(qw.shape, np.float32)
    for idx in np.ndindex(*lead, n, k):
        *e, i, j = idx
        e = tuple(e)
        if qw.format == "nvfp4":
            byte = int(np.asarray(qw.data)[(*e, i, j // 2)])
            code = byte & 0xF if j % 2 == 0 else byte >> 4
            value = (-1.0 if code & 8 else 1.0) * float(E2M1_VALUES[code & 7])
            value *= float(qw.scale[(*e, i, j // 16)]) * float(qw.global_scale[e])
        else:
            value = float(qw.data[idx])
            if qw.format == "fp8_tensor":
                value *= float(qw.scale[e])
            elif qw.format == "fp8_channel":
                value *= float(qw.scale[(*e, i)])
            else:
                bn, bk = qw.block_size
                value *= float(qw.scale[(*e, i // bn, j // bk)])
        out[idx] = value
    return out


def test_e2m1_packing_puts_the_even_element_in_the_low_nibble():
    packed = np.array([[0x3 | (0xF << 4), 0x9 | (0x7 << 4)]], np.uint8)
    np.testing.assert_array_equal(unpack_e2m1(packed), [[1.5, -6.0, -0.5, 6.0]])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(40, 48), (3, 40, 48)])
def test_dequantize_matches_the_layout_definition(fmt, shape):
    rng = np.random.default_rng(len(shape))
    qw = quantize(rng.standard_normal(shape), fmt, block_size=(16, 32))
    np.testing.assert_array_equal(dequantize(qw), _loop_dequantize(qw))
    assert qw.data.dtype == (np.uint8 if fmt == "nvfp4" else FP8)


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "nvfp4"])
def test_fp8_quantization_of_dequantized_values_is_lossless(fmt):
    rng = np.random.default_rng(3)
    first = dequantize(quantize(rng.standard_normal((2, 48, 64)), fmt, block_size=(16, 32)))
    again = dequantize(quantize(first, fmt, block_size=(16, 32)))
    np.testing.assert_array_equal(again, first)


def test_a_scale_of_the_wrong_shape_is_refused_with_the_expected_one():
    data = np.zeros((64, 32), FP8)
    with pytest.raises(ValueError, match=r"fp8_block .*scale has shape \(3, 1\), expected "
                                         r"\(4, 1\)"):
        QuantizedWeight("fp8_block", data, np.ones((3, 1), np.float32), (64, 32), np.float32,
                        block_size=(16, 32))
    with pytest.raises(ValueError, match="nvfp4 needs K divisible by 16"):
        QuantizedWeight("nvfp4", np.zeros((4, 4), np.uint8), np.zeros((4, 0), FP8), (4, 8),
                        np.float32, global_scale=np.float32(1).reshape(()))
    with pytest.raises(ValueError, match="unknown quantized format 'int4'"):
        QuantizedWeight("int4", data, None, (64, 32), np.float32)


def _weights(fmt, rng, hidden=64, inter=32, experts=4):
    def q(shape):
        return quantize(rng.standard_normal(shape) / 8, fmt, block_size=(16, 32))
    return dict(w=q((48, hidden)), gate_up=q((2 * inter, hidden)), down=q((hidden, inter)),
                w1=q((experts, 2 * inter, hidden)), w2=q((experts, hidden, inter)))


def _calls(w, x, router, ids, topk):
    norm = np.linspace(0.5, 1.5, x.shape[1]).astype(np.float32)
    shared = dict(shared_gate_up=w["gate_up"], shared_down=w["down"])
    return {
        "linear": (x, w["w"]),
        "linear_act_and_mul": (x, w["gate_up"], None, "silu"),
        "rms_norm_linear": (x, x, norm, 1e-6, w["gate_up"], None, False, "silu"),
        "moe_experts": (x, w["w1"], w["w2"], topk, ids),
        "moe_block": (x, router, w["w1"], w["w2"], 2, True, "softmax", "silu",
                      shared["shared_gate_up"], shared["shared_down"]),
        "rms_norm_moe_block": (x, None, norm, 1e-6, False, router, w["w1"], w["w2"], 2, True),
    }


def _plain(args):
    return tuple(dequantize(a) if isinstance(a, QuantizedWeight) else a for a in args)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_weight_op_computes_with_the_dequantized_weight(fmt):
    """The references, and the numpy backend's own implementations, give with a
    QuantizedWeight exactly what they give with its float32 dequantization."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    router = rng.standard_normal((4, 64)).astype(np.float32)
    ids = np.array([[0, 1], [2, 3], [1, 2], [3, 0], [0, 2]], np.int32)
    topk = rng.uniform(0.1, 1, (5, 2)).astype(np.float32)
    backend = NumpyBackend()
    for name, args in _calls(_weights(fmt, rng), x, router, ids, topk).items():
        want = getattr(ref, name)(*_plain(args))
        got_ref = getattr(ref, name)(*args)
        got_numpy = getattr(backend.ops, name)(*args)
        for a, b, c in zip(*(o if isinstance(o, tuple) else (o,) for o in (want, got_ref,
                                                                          got_numpy))):
            np.testing.assert_array_equal(b, a, err_msg=f"reference {name}")
            np.testing.assert_allclose(c, a, rtol=1e-5, atol=1e-5, err_msg=f"numpy {name}")


def test_the_numpy_weight_cache_dequantizes_once_and_forgets_rewritten_scales():
    backend = NumpyBackend()
    rng = np.random.default_rng(0)
    qw = quantize(rng.standard_normal((32, 64)), "fp8_channel")
    qw = qw.replace(scale=backend.from_host(qw.scale))
    x = rng.standard_normal((2, 64)).astype(np.float32)
    first = backend.ops.linear(x, qw)
    backend.ops.linear(x, qw)
    assert len(backend.weight_cache) == 1
    assert backend.weight_cache.nbytes == 32 * 64 * 4
    backend.copy_from_host(qw.scale, np.asarray(qw.scale) * 2)
    np.testing.assert_allclose(backend.ops.linear(x, qw), 2 * first, rtol=1e-6)


@pytest.mark.parametrize("fmt", FORMATS)
def test_row_ranges_and_experts_of_a_quantized_weight_are_its_own_slices(fmt):
    rng = np.random.default_rng(5)
    qw = quantize(rng.standard_normal((80, 64)), fmt, block_size=(16, 32))
    np.testing.assert_array_equal(dequantize(qw[16:48]), dequantize(qw)[16:48])
    np.testing.assert_array_equal(dequantize(qw[64:]), dequantize(qw)[64:])
    experts = quantize(rng.standard_normal((3, 32, 64)), fmt, block_size=(16, 32))
    np.testing.assert_array_equal(dequantize(experts[2]), dequantize(experts)[2])
    if fmt == "fp8_block":
        with pytest.raises(IndexError, match="split the 16-row scale blocks"):
            qw[8:40]
