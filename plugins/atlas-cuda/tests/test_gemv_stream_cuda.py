"""``gemv_stream.cu`` (``ATLAS_CUDA_GEMV_STREAM=1``) against the references: ``linear`` and
``rms_norm_linear`` (plain and with the gated activation) for 1-4 rows, on shapes whose block
slabs end mid-stage and mid-row, with a ring of 2 stages (reused many times) and a large one;
results are the same for a row whatever the other rows (fixed summation order)."""

import numpy as np
import pytest

from atlas_core.ops import reference as ref
from atlas_core.ops._dtypes import bfloat16
from atlas_cuda.ops_gemv import stream_plan
from cuda_probe import rel_error as rel

pytestmark = pytest.mark.gpu
rng = np.random.default_rng(11)
# (M, N, K): one block per column (N < SMs), many rows per block, K = 256 (a granule a row),
# K = 12288 (a row over 1.5 stages), gate_up-like shapes.
SHAPES = [(1, 72, 4096), (3, 1000, 2048), (4, 264, 256), (2, 300, 12288), (1, 4096, 768)]


def rand(*shape, dtype=bfloat16, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


@pytest.fixture(params=["32", "112"])
def stream_env(request, monkeypatch):
    monkeypatch.setenv("ATLAS_CUDA_GEMV_STREAM", "1")
    monkeypatch.setenv("ATLAS_CUDA_GEMV_STREAM_KB", request.param)


@pytest.mark.parametrize("dtype", [bfloat16, np.float32])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_linear_streamed(cuda_backend, stream_env, dtype, m, n, k):
    be = cuda_backend
    assert stream_plan(n, k, m, np.dtype(dtype).itemsize, be.num_sms) is not None
    x, w, b = rand(m, k, dtype=dtype), rand(n, k, dtype=dtype, scale=k ** -0.5), rand(n, dtype=dtype)
    y = be.to_host(be.ops.linear(be.from_host(x), be.from_host(w), be.from_host(b)))
    assert rel(y, ref.linear(x, w, b)) < (1e-2 if dtype == bfloat16 else 1e-5)


@pytest.mark.parametrize("residual,zc,activation", [(True, False, None), (False, False, None),
                                                    (True, True, "silu"), (True, False, "gelu_tanh")])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_rms_norm_linear_streamed(cuda_backend, stream_env, residual, zc, activation, m, n, k):
    be = cuda_backend
    rows = 2 * n if activation else n
    x, res = rand(m, k, scale=3.0), rand(m, k) if residual else None
    nw, w, b = rand(k, scale=0.5), rand(rows, k, scale=k ** -0.5), rand(rows)
    args = (x, res, nw, 1e-6, w, b, zc, activation)
    y, r = be.ops.rms_norm_linear(*(be.from_host(a) if isinstance(a, np.ndarray) else a
                                    for a in args))
    want_y, want_r = ref.rms_norm_linear(*args)
    assert rel(be.to_host(y), want_y) < 1e-2
    np.testing.assert_array_equal(be.to_host(r).view(np.uint16), want_r.view(np.uint16))


def test_rows_do_not_depend_on_batch(cuda_backend, monkeypatch):
    """A row's output is bit-identical alone and among 2 or 4 rows, and from run to run."""
    monkeypatch.setenv("ATLAS_CUDA_GEMV_STREAM", "1")
    be = cuda_backend
    x, w = rand(4, 4096), rand(6144, 4096, scale=4096 ** -0.5)
    dw = be.from_host(w)
    alone = be.to_host(be.ops.linear(be.from_host(x[:1]), dw))
    for m in (2, 4, 4):
        y = be.to_host(be.ops.linear(be.from_host(x[:m]), dw))
        np.testing.assert_array_equal(y[:1].view(np.uint16), alone.view(np.uint16))


def test_falls_back_where_it_does_not_apply(cuda_backend, monkeypatch):
    """K not a multiple of 256 or more than 4 rows: the tiled GEMV, same results as the
    reference."""
    monkeypatch.setenv("ATLAS_CUDA_GEMV_STREAM", "1")
    be = cuda_backend
    for m, n, k in [(1, 64, 264), (6, 128, 1024)]:
        assert stream_plan(n, k, m, 2, be.num_sms) is None
        x, w = rand(m, k), rand(n, k, scale=k ** -0.5)
        y = be.to_host(be.ops.linear(be.from_host(x), be.from_host(w)))
        assert rel(y, ref.linear(x, w)) < 1e-2
