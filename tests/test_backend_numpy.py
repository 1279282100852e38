"""The numpy backend passes the whole GpuBackend contract, plus its own weight-cache checks."""

import gc

import numpy as np

from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.ops import reference
from atlas_core.ops._dtypes import bfloat16
from atlas_core.testing.contracts import GpuBackendContract


class TestNumpyBackend(GpuBackendContract):
    backend_name = "numpy"


def test_weight_cache_follows_array_lifetime():
    backend = NumpyBackend()
    x = np.ones((2, 8), bfloat16)
    w = backend.from_host(np.full((4, 8), 0.5, np.float32).astype(bfloat16))
    backend.ops.linear(x, w)
    assert len(backend.weight_cache) == 1
    del w
    gc.collect()
    assert len(backend.weight_cache) == 0


def test_weight_cache_invalidated_by_backend_writes():
    backend = NumpyBackend()
    x = np.ones((2, 8), bfloat16)
    w = backend.from_host(np.full((4, 8), 0.5, np.float32).astype(bfloat16))
    np.testing.assert_array_equal(backend.ops.linear(x, w).astype(np.float32), 4.0)
    backend.copy_from_host(w[1:2], np.full((1, 8), 2.0, np.float32).astype(bfloat16))
    out = backend.ops.linear(x, w).astype(np.float32)
    np.testing.assert_array_equal(out, reference.linear(x, w).astype(np.float32))
    assert out[0, 1] == 16.0


def test_copy_from_host_rejects_dtype_mismatch():
    backend = NumpyBackend()
    dst = backend.zeros((2, 2), np.int32)
    try:
        backend.copy_from_host(dst, np.zeros((2, 2), np.int64))
    except ValueError as exc:
        assert "dtype" in str(exc)
    else:
        raise AssertionError("expected ValueError")


def test_dtype_names_accepted():
    backend = NumpyBackend()
    assert backend.empty((2,), "bf16").dtype == bfloat16
    assert backend.zeros((2,), "float32").dtype == np.float32


def test_numpy_fallbacks_match_reference(monkeypatch):
    """Without numba the backend takes pure NumPy paths with the same results."""
    from atlas_core.backends import numpy_attention, numpy_kernels
    from atlas_core.testing.contracts_sampling import SAMPLING_ROWS, sampling_params

    monkeypatch.setattr(numpy_kernels, "_race_jit", None)
    monkeypatch.setattr(numpy_attention, "paged_attention_kernel", None)
    backend = NumpyBackend()
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((12, 700)).astype(np.float32) * 2
    params = sampling_params(SAMPLING_ROWS, 12, seed0=5, step=2)
    np.testing.assert_array_equal(backend.ops.sample(logits, *params), reference.sample(logits, *params))
    cache = rng.standard_normal((4, 16, 2, 64)).astype(bfloat16)
    q = rng.standard_normal((2, 4, 64)).astype(bfloat16)
    args = (q, cache, cache, np.array([[0, 1], [3, 2]], np.int32), np.array([17, 30], np.int32),
            np.array([0, 1, 2], np.int32), 0.125)
    np.testing.assert_allclose(backend.ops.paged_attention(*args).astype(np.float32),
                               reference.paged_attention(*args).astype(np.float32), rtol=2e-2, atol=2e-2)
