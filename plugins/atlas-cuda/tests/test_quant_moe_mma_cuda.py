"""Quantized decode MoE experts on the tensor cores (quant_moe_mma.cu, issue #22) against the
NumPy reference: FP8 block / channel and NVFP4 stacks, 1 / 3 / 8 tokens, top-1 / 2 / 8, 8 and
128 experts, hidden 2048 with intermediate 512 / 768, bf16 and f16 activations; a shape the
kernels cannot take (falls back to quant_moe.cu) and the legacy policy on the same inputs."""

from functools import lru_cache

import numpy as np
import pytest

from atlas_core.api import bfloat16, quantize
from atlas_core.api import reference as ref
from cuda_probe import device_rel_error as rel

pytestmark = pytest.mark.gpu
FORMATS = ["fp8_block", "fp8_channel", "nvfp4"]
DTYPES = {"bf16": bfloat16, "f16": np.float16}
#: As test_quant_cuda.py's MoE tests: h is rounded to the activation dtype between the kernels
#: (the reference keeps it in f32), the output once more.
TOL = 2e-2
#: The 128-expert stacks tile BASE distinct experts; each copy's scales (FP8) or global scale
#: (NVFP4) carry their own power of two, so reading a wrong expert cannot go unnoticed.
BASE = 8


def upload(be, q):
    """The device copy of a host quantized weight, as the loader makes it."""
    dev = {k: None if a is None else be.from_host(np.ascontiguousarray(a))
           for k, a in (("data", q.data), ("scale", np.asarray(q.scale)),
                        ("global_scale", q.global_scale))}
    return q.replace(**dev)


def _stack(fmt, experts, n, k, seed):
    """``experts`` quantized [n, k] matrices (BASE distinct ones, tiled past BASE)."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((min(experts, BASE), n, k)).astype(np.float32) * k ** -0.5
    q = quantize(base, fmt, dtype=bfloat16)
    if experts <= BASE:
        return q
    reps = experts // BASE
    factor = np.exp2((np.arange(experts) * 3) % 5 - 2.0).astype(np.float32)
    tile = lambda a: np.tile(np.asarray(a), (reps,) + (1,) * (np.asarray(a).ndim - 1))  # noqa: E731
    per = lambda a: factor.reshape((-1,) + (1,) * (a.ndim - 1))  # noqa: E731
    data, scale = tile(q.data), tile(q.scale)
    gscale = None if q.global_scale is None else tile(q.global_scale)
    if fmt == "nvfp4":
        gscale = (gscale * per(gscale)).astype(np.float32)
    else:
        scale = (scale * per(scale)).astype(np.float32)
    return q.replace(data=data, scale=scale, global_scale=gscale, shape=(experts, n, k))


@lru_cache(maxsize=1)
def _experts(fmt, experts, hidden, inter):
    """Host stacks of (gate_up, down); one shape cached at a time (the 128-expert ones hold
    ~0.6 GB)."""
    return _stack(fmt, experts, 2 * inter, hidden, 1), _stack(fmt, experts, hidden, inter, 2)


@lru_cache(maxsize=1)
def _device(be, fmt, experts, hidden, inter):
    gu, down = _experts(fmt, experts, hidden, inter)
    return upload(be, gu), upload(be, down)


def _one(q, e):
    """Expert ``e`` of a stack as a stack of one (the reference then dequantizes one)."""
    pick = lambda a: None if a is None else np.asarray(a)[e:e + 1]  # noqa: E731
    return q.replace(data=q.data[e:e + 1], scale=pick(q.scale),
                     global_scale=pick(q.global_scale), shape=(1, *q.shape[1:]))


def _reference(x, gu, down, wts, ids, activation):
    """``ref.moe_experts`` expert by expert in f32 (dequantizing only the chosen experts of a
    128-expert stack), then rounded to x's dtype."""
    out = np.zeros(x.shape, np.float32)
    xf = x.astype(np.float32)
    for e in np.unique(ids):
        rows, slots = np.nonzero(ids == e)  # a token picks an expert at most once
        out[rows] += ref.moe_experts(xf[rows], _one(gu, e), _one(down, e),
                                     wts[rows, slots][:, None],
                                     np.zeros((len(rows), 1), np.int32), activation)
    return out.astype(x.dtype)


def _inputs(t, top, experts, hidden, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((t, hidden)).astype(dtype)
    ids = np.stack([rng.choice(experts, top, replace=False) for _ in range(t)]).astype(np.int32)
    wts = rng.random((t, top)).astype(np.float32)
    return x, ids, wts


def _run(be, fmt, experts, hidden, inter, t, top, dtype, activation="silu", seed=0):
    gu, down = _experts(fmt, experts, hidden, inter)
    dgu, ddown = _device(be, fmt, experts, hidden, inter)
    x, ids, wts = _inputs(t, top, experts, hidden, DTYPES[dtype], seed)
    y = be.ops.moe_experts(be.from_host(x), dgu, ddown, be.from_host(wts), be.from_host(ids),
                           activation)
    want = _reference(x, gu, down, wts, ids, activation)
    return rel(be, y, want)


# Ordered by shape so each cached stack is built and uploaded once.
SMALL = [(fmt, dt, t, top) for fmt in FORMATS for dt in DTYPES for t in (1, 3, 8)
         for top in (1, 2, 8)]
LARGE = [(fmt, dt, t, top) for fmt in FORMATS for dt in DTYPES
         for t, top in ((1, 8), (3, 2), (8, 8))]


@pytest.mark.parametrize("fmt,dtype,t,top", SMALL)
def test_eight_experts_intermediate_512(cuda_backend, fmt, dtype, t, top):
    assert _run(cuda_backend, fmt, 8, 2048, 512, t, top, dtype, seed=t * 10 + top) < TOL


@pytest.mark.parametrize("fmt,dtype,t,top", LARGE)
def test_128_experts_intermediate_768(cuda_backend, fmt, dtype, t, top):
    assert _run(cuda_backend, fmt, 128, 2048, 768, t, top, dtype, seed=t * 10 + top) < TOL


@pytest.mark.parametrize("fmt", FORMATS)
def test_gelu_tanh(cuda_backend, fmt):
    assert _run(cuda_backend, fmt, 8, 2048, 512, 3, 2, "bf16", "gelu_tanh") < TOL


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_an_odd_shape_falls_back_correctly(cuda_backend, fmt, dtype):
    """Intermediate 96 is no whole 128-wide step: quant_moe.cu's kernels serve it."""
    assert _run(cuda_backend, fmt, 8, 256, 96, 3, 2, dtype) < TOL


@pytest.mark.parametrize("fmt", FORMATS)
def test_legacy_policy_agrees_on_the_same_inputs(cuda_backend, use_policy, fmt):
    new = _run(cuda_backend, fmt, 8, 2048, 512, 8, 8, "bf16", seed=7)
    use_policy(quant_kernel="legacy")
    old = _run(cuda_backend, fmt, 8, 2048, 512, 8, 8, "bf16", seed=7)
    assert new < TOL and old < TOL
