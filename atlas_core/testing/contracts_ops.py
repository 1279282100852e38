"""Shared helpers of the contract tests (:class:`~atlas_core.testing.contracts.GpuBackendContract`)
and the hand-written ``linear`` test.

Every op runs on fresh random inputs (seeded from the case, so failures reproduce) and is
compared with its NumPy reference as ``||out - ref|| / ||ref||`` against :data:`TOLERANCES`.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest

from atlas_core.ops import reference as ref
from atlas_core.ops._dtypes import as_dtype
from atlas_core.ops.quant import QuantizedWeight

#: Largest allowed relative error ``||out - ref|| / ||ref||`` per output storage dtype.
TOLERANCES = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.2e-2, "float8_e4m3fn": 7e-2}

BLOCK_SIZE = 16
DTYPES = ("float32", "bfloat16")


def make_rng(*case: Any) -> np.random.Generator:
    """A generator seeded from the test case, so every case has its own reproducible inputs."""
    return np.random.default_rng(zlib.crc32(repr(case).encode()))


def randn(rng: np.random.Generator, shape, dtype="float32", scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(as_dtype(dtype))


def rel_error(out: np.ndarray, expected: np.ndarray) -> float:
    o, r = np.asarray(out, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    return float(np.linalg.norm(o - r) / max(np.linalg.norm(r), 1e-30))


def assert_close(out: np.ndarray, expected: np.ndarray, what: str = "output",
                 tol_scale: float = 1.0) -> None:
    """Same shape and dtype, NaN exactly where the reference has NaN (poisoned slots), and
    within the dtype's tolerance (times ``tol_scale``) elsewhere."""
    out, expected = np.asarray(out), np.asarray(expected)
    assert out.shape == expected.shape, f"{what}: shape {out.shape}, expected {expected.shape}"
    assert out.dtype == expected.dtype, f"{what}: dtype {out.dtype}, expected {expected.dtype}"
    if expected.dtype.kind in "iub":
        np.testing.assert_array_equal(out, expected, err_msg=what)
        return
    finite = np.isfinite(expected.astype(np.float32))
    assert np.isfinite(out.astype(np.float32))[finite].all(), f"{what}: non-finite values"
    nan = np.isnan(expected.astype(np.float32))
    assert np.isnan(out.astype(np.float32))[nan].all(), f"{what}: wrote elements it should not"
    tol = TOLERANCES[expected.dtype.name] * tol_scale
    err = rel_error(out[finite], expected[finite])
    assert err <= tol, f"{what}: relative error {err:.2e} > {tol:.0e} ({expected.dtype.name})"


def to_device(backend, x: Any) -> Any:
    if isinstance(x, list):
        return [to_device(backend, y) for y in x]
    if isinstance(x, QuantizedWeight):
        from atlas_core.testing.quant_cases import quantized_to_device
        return quantized_to_device(backend, x)
    return backend.from_host(x) if isinstance(x, np.ndarray) else x


def to_host(backend, x: Any) -> Any:
    if isinstance(x, tuple):
        return tuple(to_host(backend, y) for y in x)
    return None if x is None else backend.to_host(x)


def run_op(backend, name: str, *args: Any, **kwargs: Any) -> Any:
    """Upload every NumPy argument, run ``backend.ops.<name>``, download the result."""
    out = getattr(backend.ops, name)(*(to_device(backend, a) for a in args),
                                     **{k: to_device(backend, v) for k, v in kwargs.items()})
    return to_host(backend, out)


def check_op(backend, name: str, *args: Any, **kwargs: Any) -> None:
    """Run op ``name`` on the backend and through its reference and compare every output."""
    out = run_op(backend, name, *args, **kwargs)
    expected = getattr(ref, name)(*args, **kwargs)
    outs, exps = (out, expected) if isinstance(expected, tuple) else ((out,), (expected,))
    assert len(outs) == len(exps), f"{name}: {len(outs)} outputs, expected {len(exps)}"
    for i, (o, e) in enumerate(zip(outs, exps)):
        assert_close(o, e, f"{name} output {i}")


def poisoned(shape, dtype) -> np.ndarray:
    """A NaN-filled array: cache slots an in-place op must not touch stay NaN."""
    return np.full(shape, np.nan, dtype=np.float32).astype(as_dtype(dtype))


def make_block_tables(rng, seq_lens, num_blocks: int) -> np.ndarray:
    """Shuffled distinct block ids per sequence; unused entries hold an out-of-range id."""
    need = [-(-int(n) // BLOCK_SIZE) for n in seq_lens]
    ids = rng.permutation(num_blocks)[:sum(need)]
    tables = np.full((len(seq_lens), max(need) + 1), num_blocks + 7, dtype=np.int32)
    start = 0
    for b, n in enumerate(need):
        tables[b, :n] = ids[start:start + n]
        start += n
    return tables


class OpContract:
    """``linear``, run twice with the same weight (backends that cache converted weights must
    stay correct). The other core ops of this family are generated from their specs' cases
    (:mod:`atlas_core.testing.contracts_core_cases`)."""

    @pytest.mark.parametrize("dtype", ("float32", "bfloat16", "float16"))
    @pytest.mark.parametrize("x_shape,out_features,bias",
                             [((1, 64), 96, False), ((13, 100), 37, True), ((2, 3, 64), 128, False),
                              ((3, 2056), 40, True)])
    def test_linear(self, backend, dtype, x_shape, out_features, bias):
        rng = make_rng("linear", dtype, x_shape, out_features, bias)
        w = randn(rng, (out_features, x_shape[-1]), dtype, x_shape[-1] ** -0.5)
        b = randn(rng, (out_features,), dtype) if bias else None
        check_op(backend, "linear", randn(rng, x_shape, dtype), w, b)
        # The same weight again: backends that cache converted weights must stay correct.
        check_op(backend, "linear", randn(rng, x_shape, dtype), w, b)
