"""Op tests of :class:`~atlas_core.testing.contracts.GpuBackendContract` (all but sampling).

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
from atlas_core.ops.rotary import rope_cos_sin_cache

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
    """Elementwise, linear, rotary, KV-cache, attention and MoE op tests."""

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("vocab,hidden", [(37, 64), (1000, 96)])
    def test_embedding(self, backend, dtype, vocab, hidden):
        rng = make_rng("embedding", dtype, vocab, hidden)
        ids = np.concatenate([[0, vocab - 1], rng.integers(0, vocab, 9)]).astype(np.int32)
        check_op(backend, "embedding", ids, randn(rng, (vocab, hidden), dtype))

    @pytest.mark.parametrize("dtype", ("float32", "bfloat16", "float16"))
    @pytest.mark.parametrize("shape", [(7, 96), (2, 5, 64), (1, 4096)])
    @pytest.mark.parametrize("residual,zero_centered", [(False, False), (True, False), (True, True)])
    def test_rms_norm(self, backend, dtype, shape, residual, zero_centered):
        rng = make_rng("rms_norm", dtype, shape, residual, zero_centered)
        res = randn(rng, shape, dtype) if residual else None
        check_op(backend, "rms_norm", randn(rng, shape, dtype, 3.0),
                 randn(rng, shape[-1:], dtype, 0.5), 1e-6, res, zero_centered=zero_centered)

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

    @pytest.mark.parametrize("dtype", ("float32", "bfloat16", "float16"))
    @pytest.mark.parametrize("x_shape,d,bias,activation",
                             [((1, 64), 48, False, "silu"), ((3, 1032), 24, True, "silu"),
                              ((2, 3, 2056), 16, False, "gelu_tanh"), ((13, 100), 20, True, "silu"),
                              ((9, 64), 40, False, "gelu_tanh")])
    def test_linear_act_and_mul(self, backend, dtype, x_shape, d, bias, activation):
        rng = make_rng("linear_act_and_mul", dtype, x_shape, d, bias, activation)
        w = randn(rng, (2 * d, x_shape[-1]), dtype, 2 * x_shape[-1] ** -0.5)
        b = randn(rng, (2 * d,), dtype) if bias else None
        check_op(backend, "linear_act_and_mul", randn(rng, x_shape, dtype), w, b, activation)

    @pytest.mark.parametrize("dtype", ("float32", "bfloat16"))
    @pytest.mark.parametrize("rows,k,n,bias", [(1, 64, 96, False), (3, 1032, 40, True),
                                               (8, 512, 72, False), (13, 96, 37, True)])
    @pytest.mark.parametrize("residual,zero_centered,activation",
                             [(True, False, None), (False, False, None), (True, True, "silu"),
                              (True, False, "gelu_tanh")])
    def test_rms_norm_linear(self, backend, dtype, rows, k, n, bias, residual, zero_centered,
                             activation):
        rng = make_rng("rms_norm_linear", dtype, rows, k, n, bias, residual, zero_centered,
                       activation)
        n_w = 2 * n if activation else n
        w = randn(rng, (n_w, k), dtype, k ** -0.5)
        b = randn(rng, (n_w,), dtype) if bias else None
        res = randn(rng, (rows, k), dtype) if residual else None
        check_op(backend, "rms_norm_linear", randn(rng, (rows, k), dtype, 3.0), res,
                 randn(rng, (k,), dtype, 0.5), 1e-6, w, b, zero_centered, activation)

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("shape", [(7, 33), (2, 3, 128)])
    def test_add(self, backend, dtype, shape):
        rng = make_rng("add", dtype, shape)
        check_op(backend, "add", randn(rng, shape, dtype), randn(rng, shape, dtype))

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("shape", [(5, 96), (2, 3, 34)])
    def test_silu_and_mul(self, backend, dtype, shape):
        check_op(backend, "silu_and_mul", randn(make_rng("silu", dtype, shape), shape, dtype, 2.0))

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("shape", [(5, 96), (2, 3, 34)])
    def test_gelu_tanh_and_mul(self, backend, dtype, shape):
        check_op(backend, "gelu_tanh_and_mul",
                 randn(make_rng("gelu", dtype, shape), shape, dtype, 2.0))

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("head_dim,rotary_dim", [(64, None), (128, 128), (128, 64), (64, 32)])
    @pytest.mark.parametrize("is_neox", [True, False])
    def test_rotary_embedding(self, backend, dtype, head_dim, rotary_dim, is_neox):
        rng = make_rng("rotary", dtype, head_dim, rotary_dim, is_neox)
        cache = rope_cos_sin_cache(rotary_dim or head_dim, 600, {"rope_type": "default",
                                                                 "rope_theta": 10000.0})
        positions = rng.integers(0, 600, 11).astype(np.int32)
        check_op(backend, "rotary_embedding", randn(rng, (11, 8, head_dim), dtype),
                 randn(rng, (11, 2, head_dim), dtype), positions, cache, rotary_dim, is_neox)

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("num_experts,top_k,renormalize,scoring",
                             [(8, 2, True, "softmax"), (16, 4, False, "softmax"),
                              (8, 1, False, "softmax"), (16, 2, True, "sigmoid")])
    def test_moe_route(self, backend, dtype, num_experts, top_k, renormalize, scoring):
        rng = make_rng("moe_route", dtype, num_experts, top_k, renormalize, scoring)
        # Well-separated logits, so the chosen experts do not hinge on rounding.
        logits = np.stack([rng.permutation(num_experts) for _ in range(9)]) * 0.25
        logits = (logits + rng.uniform(-0.01, 0.01, logits.shape)).astype(as_dtype(dtype))
        check_op(backend, "moe_route", logits, top_k, renormalize, scoring)

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("num_experts,top_k,activation",
                             [(4, 2, "silu"), (8, 2, "gelu_tanh"), (8, 8, "silu")])
    def test_moe_experts(self, backend, dtype, num_experts, top_k, activation):
        rng = make_rng("moe_experts", dtype, num_experts, top_k, activation)
        tokens, hidden, inter = 11, 64, 48
        weights, ids = ref.moe_route(randn(rng, (tokens, num_experts)), top_k, True)
        check_op(backend, "moe_experts", randn(rng, (tokens, hidden), dtype),
                 randn(rng, (num_experts, 2 * inter, hidden), dtype, hidden ** -0.5),
                 randn(rng, (num_experts, hidden, inter), dtype, inter ** -0.5), weights, ids,
                 activation)

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("tokens,num_experts,top_k,shared,scoring", [
        (1, 16, 4, 0, "softmax"), (3, 8, 2, 24, "softmax"), (8, 64, 8, 48, "softmax"),
        (11, 16, 2, 40, "softmax"), (2, 16, 4, 32, "sigmoid")])
    def test_moe_block(self, backend, dtype, tokens, num_experts, top_k, shared, scoring):
        rng = make_rng("moe_block", dtype, tokens, num_experts, top_k, shared, scoring)
        hidden, inter = 64, 40
        x, router = separated_router(rng, dtype, tokens, hidden, num_experts, top_k)
        experts, kw = moe_block_weights(rng, dtype, num_experts, hidden, inter, shared)
        check_op(backend, "moe_block", x, router, *experts, top_k, True, scoring, "silu", **kw)

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("tokens,num_experts,top_k,shared,residual,zero_centered", [
        (1, 16, 4, 0, True, False), (3, 8, 2, 24, True, True), (8, 64, 8, 48, False, False)])
    def test_rms_norm_moe_block(self, backend, dtype, tokens, num_experts, top_k, shared,
                                residual, zero_centered):
        rng = make_rng("rms_norm_moe_block", dtype, tokens, num_experts, top_k, shared, residual,
                       zero_centered)
        hidden, inter = 64, 40
        x = randn(rng, (tokens, hidden), dtype, 3.0)
        res = randn(rng, (tokens, hidden), dtype) if residual else None
        nw = randn(rng, (hidden,), dtype, 0.5)
        normed = ref.rms_norm(x, nw, 1e-6, res, zero_centered=zero_centered)
        normed = normed[0] if residual else normed
        _, router = separated_router(rng, dtype, tokens, hidden, num_experts, top_k, x=normed)
        experts, kw = moe_block_weights(rng, dtype, num_experts, hidden, inter, shared)
        check_op(backend, "rms_norm_moe_block", x, res, nw, 1e-6, zero_centered, router,
                 *experts, top_k, True, "softmax", "silu", **kw)


def moe_block_weights(rng, dtype, num_experts, hidden, inter, shared):
    """``((w_gate_up, w_down), shared-expert kwargs)`` of a ``moe_block`` case (no shared
    expert when ``shared`` is 0)."""
    experts = (randn(rng, (num_experts, 2 * inter, hidden), dtype, hidden ** -0.5),
               randn(rng, (num_experts, hidden, inter), dtype, inter ** -0.5))
    if not shared:
        return experts, {}
    return experts, dict(shared_gate_up=randn(rng, (2 * shared, hidden), dtype, hidden ** -0.5),
                         shared_down=randn(rng, (hidden, shared), dtype, shared ** -0.5),
                         shared_gate=randn(rng, (1, hidden), dtype, hidden ** -0.5))


def separated_router(rng, dtype, tokens, hidden, num_experts, top_k, x=None):
    """Inputs and router whose top-k choice does not hinge on rounding (the k-th and (k+1)-th
    logits of every token at least 0.05 apart); ``x``: keep these inputs, draw only routers."""
    given = x
    while True:
        x = randn(rng, (tokens, hidden), dtype) if given is None else given
        router = randn(rng, (num_experts, hidden), dtype, hidden ** -0.5)
        logits = -np.sort(-(x.astype(np.float64) @ router.astype(np.float64).T), axis=-1)
        gap = logits[:, top_k - 1] - logits[:, top_k] if top_k < num_experts else 1.0
        if np.min(gap) > 0.05:
            return x, router
