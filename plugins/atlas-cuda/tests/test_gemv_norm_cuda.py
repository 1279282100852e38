"""``gemv_norm.cu`` against the references: ``linear`` with at most 8 rows on every policy
``gemv_tile`` (``ATLAS_CUDA_GEMV_TILE``: columns per warp G, K splits S) and ``rms_norm_linear``
fused and as its two-op composition, with and without residual, zero-centred weight and the
gated activation, on K that end mid-chunk."""

import numpy as np
import pytest

from atlas_core.api import reference as ref
from atlas_core.api import bfloat16
from atlas_core.api import compose_rms_norm_linear
from cuda_probe import rel_error as rel

pytestmark = pytest.mark.gpu
rng = np.random.default_rng(5)
SHAPES = [(1, 72, 4096), (3, 40, 1024), (8, 24, 3072 + 8), (5, 16, 12288), (2, 9, 264)]
TILES = ["g1s1", "g2s1", "g4s1", "g1s2", "g4s2", "g2s4", "g4s4", "g1s8"]


def rand(*shape, dtype=bfloat16, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


@pytest.mark.parametrize("tile", TILES + ["auto"])
@pytest.mark.parametrize("dtype", [bfloat16, np.float32])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_linear_tiles(cuda_backend, use_policy, tile, dtype, m, n, k):
    use_policy(gemv_tile=tile)
    be = cuda_backend
    x, w, b = rand(m, k, dtype=dtype), rand(n, k, dtype=dtype, scale=k ** -0.5), rand(n, dtype=dtype)
    y = be.to_host(be.ops.linear(be.from_host(x), be.from_host(w), be.from_host(b)))
    assert rel(y, ref.linear(x, w, b)) < (1e-2 if dtype == bfloat16 else 1e-5)


@pytest.mark.parametrize("fused,tile", [("1", "g1s1"), ("1", "g2s2"), ("1", "g1s8"),
                                        ("1", "g4s1"), ("1", "g4s2"), ("1", "auto"),
                                        ("0", "auto")])
@pytest.mark.parametrize("residual,zc,activation", [(True, False, None), (False, False, None),
                                                    (True, True, "silu"), (True, False, "gelu_tanh")])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_rms_norm_linear(cuda_backend, use_policy, fused, tile, residual, zc, activation, m, n,
                         k):
    use_policy(gemv_tile=tile)
    be = cuda_backend
    op = be.ops.rms_norm_linear if fused == "1" else (
        lambda *a: compose_rms_norm_linear(be.ops, *a))
    rows = 2 * n if activation else n
    x, res = rand(m, k, scale=3.0), rand(m, k) if residual else None
    nw, w, b = rand(k, scale=0.5), rand(rows, k, scale=k ** -0.5), rand(rows)
    args = (x, res, nw, 1e-6, w, b, zc, activation)
    y, r = op(*(be.from_host(a) if isinstance(a, np.ndarray) else a for a in args))
    want_y, want_r = ref.rms_norm_linear(*args)
    assert rel(be.to_host(y), want_y) < 1e-2
    np.testing.assert_array_equal(be.to_host(r).view(np.uint16), want_r.view(np.uint16))


def test_fused_and_unfused_agree(cuda_backend):
    """The fused kernel normalises as rms_norm does (rounded to bf16 first): the two paths differ
    only by float32 summation order."""
    be = cuda_backend
    x, res, nw = rand(1, 4096, scale=3.0), rand(1, 4096), rand(4096, scale=0.5)
    w = rand(6144, 4096, scale=4096 ** -0.5)
    out = {}
    for fused, op in (("0", lambda *a: compose_rms_norm_linear(be.ops, *a)),
                      ("1", be.ops.rms_norm_linear)):
        y, _ = op(be.from_host(x), be.from_host(res), be.from_host(nw), 1e-6, be.from_host(w))
        out[fused] = be.to_host(y).astype(np.float32)
    diff = np.abs(out["0"] - out["1"])
    assert diff.max() <= 0.02 * np.abs(out["0"]).max()
