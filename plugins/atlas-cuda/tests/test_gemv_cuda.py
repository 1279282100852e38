"""The decode GEMVs (at most 8 rows; 9 rows take two row tiles) against the references:
``linear`` and ``linear_act_and_mul``, on shapes whose K exercises every tail of the GEMV's loads.
The 8-load ``gemv_fused.cu`` variants measured slower and were removed (docs/benchmarks.md)."""

import numpy as np
import pytest

from atlas_core.api import reference as ref
from atlas_core.api import bfloat16
from cuda_probe import device_rel_error as rel

pytestmark = pytest.mark.gpu
rng = np.random.default_rng(3)
SHAPES = [(1, 72, 4096), (3, 40, 1024), (8, 24, 3072 + 8), (5, 16, 12288), (9, 32, 2048)]


def rand(*shape, dtype=bfloat16, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


@pytest.mark.parametrize("dtype", [bfloat16, np.float32])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemv(cuda_backend, dtype, m, n, k):
    be = cuda_backend
    x, w, b = rand(m, k, dtype=dtype), rand(n, k, dtype=dtype, scale=k ** -0.5), rand(n, dtype=dtype)
    y = be.ops.linear(be.from_host(x), be.from_host(w), be.from_host(b))
    assert rel(be, y, ref.linear(x, w, b)) < (1e-2 if dtype == bfloat16 else 1e-5)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("m,d,k", SHAPES)
def test_linear_act_and_mul(cuda_backend, activation, m, d, k):
    be = cuda_backend
    x, w = rand(m, k), rand(2 * d, k, scale=2 * k ** -0.5)
    y = be.ops.linear_act_and_mul(be.from_host(x), be.from_host(w), None, activation)
    assert rel(be, y, ref.linear_act_and_mul(x, w, None, activation)) < 1e-2
