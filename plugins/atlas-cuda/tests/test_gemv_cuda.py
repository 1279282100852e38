"""The decode GEMVs (at most 8 rows) on both settings of their switches, against the references:
``ATLAS_CUDA_GEMV_CHUNKS`` 4 / 8 for ``linear`` and ``ATLAS_CUDA_FUSE_GATE_UP`` 0 / 1 for
``linear_act_and_mul``, on shapes whose K exercises every chunk-group tail of the 8-chunk loop."""

import numpy as np
import pytest

from atlas_core.ops import reference as ref
from atlas_core.ops._dtypes import bfloat16
from cuda_probe import device_rel_error as rel

pytestmark = pytest.mark.gpu
rng = np.random.default_rng(3)
SHAPES = [(1, 72, 4096), (3, 40, 1024), (8, 24, 3072 + 8), (5, 16, 12288), (9, 32, 2048)]


def rand(*shape, dtype=bfloat16, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


@pytest.mark.parametrize("chunks", ["4", "8"])
@pytest.mark.parametrize("dtype", [bfloat16, np.float32])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemv_chunks(cuda_backend, monkeypatch, chunks, dtype, m, n, k):
    monkeypatch.setenv("ATLAS_CUDA_GEMV_CHUNKS", chunks)
    be = cuda_backend
    x, w, b = rand(m, k, dtype=dtype), rand(n, k, dtype=dtype, scale=k ** -0.5), rand(n, dtype=dtype)
    y = be.ops.linear(be.from_host(x), be.from_host(w), be.from_host(b))
    assert rel(be, y, ref.linear(x, w, b)) < (1e-2 if dtype == bfloat16 else 1e-5)


@pytest.mark.parametrize("fuse", ["0", "1"])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("m,d,k", SHAPES)
def test_linear_act_and_mul_fused(cuda_backend, monkeypatch, fuse, activation, m, d, k):
    monkeypatch.setenv("ATLAS_CUDA_FUSE_GATE_UP", fuse)
    be = cuda_backend
    x, w = rand(m, k), rand(2 * d, k, scale=2 * k ** -0.5)
    y = be.ops.linear_act_and_mul(be.from_host(x), be.from_host(w), None, activation)
    assert rel(be, y, ref.linear_act_and_mul(x, w, None, activation)) < 1e-2


def test_fused_and_unfused_agree(cuda_backend, monkeypatch):
    """Both paths round the projection to bf16 before the activation: they differ only by the
    float32 summation order (a few bf16 ulps), not systematically."""
    be = cuda_backend
    x, w = rand(1, 4096), rand(2 * 64, 4096, scale=4096 ** -0.5)
    out = {}
    for fuse in ("0", "1"):
        monkeypatch.setenv("ATLAS_CUDA_FUSE_GATE_UP", fuse)
        out[fuse] = be.to_host(be.ops.linear_act_and_mul(be.from_host(x), be.from_host(w)))
    diff = np.abs(out["0"].astype(np.float32) - out["1"].astype(np.float32))
    assert diff.max() <= 0.02 * np.abs(out["0"].astype(np.float32)).max()
