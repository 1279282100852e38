"""Recurrent-layer op tests (Gated DeltaNet) of :class:`~atlas_core.testing.contracts.GpuBackendContract`.

State pools start NaN-poisoned except the slots of sequences that continue from earlier steps:
an op must read only those, write every used slot and leave the others NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.ops import reference as ref
from atlas_core.testing.contracts_ops import (DTYPES, assert_close, check_op, make_rng, poisoned,
                                              randn, to_device)

#: Query rows per sequence, tokens cached before this step, and state slots (-1: padding row).
NUM_Q = [5, 20, 1, 9]
CONTEXT = [3, 0, 2, 0]
SLOTS = [4, 1, -1, 2]
NUM_SLOTS = 6
#: Delta-rule state recurrences amplify rounding; their outputs get this much looser tolerance.
RECURRENT_TOL_SCALE = 10.0
#: (num_k_heads, num_v_heads, head_k_dim, head_v_dim).
DELTA_HEADS = [(2, 4, 16, 8), (1, 1, 32, 32)]
POOL = object()


def _layout(num_q, context, slots):
    cu = np.concatenate([[0], np.cumsum(num_q)]).astype(np.int32)
    return cu, (np.array(num_q) + np.array(context)).astype(np.int32), np.array(slots, np.int32)


def _pool(rng, shape, seq_lens, num_q, slots) -> np.ndarray:
    # NaN everywhere except the slots a sequence continues from.
    pool = poisoned(shape, "float32")
    for n_ctx, n_q, slot in zip(seq_lens, num_q, slots):
        if slot >= 0 and n_ctx > n_q:
            pool[slot] = rng.standard_normal(shape[1:]) * 0.5
    return pool


def _check_stateful(backend, name, args, pool, kwargs, tol_scale=1.0):
    # `args` holds POOL where the state pool goes.
    dev_pool = backend.from_host(pool)
    pool_index = next(i for i, a in enumerate(args) if a is POOL)
    dev_args = [dev_pool if a is POOL else to_device(backend, a) for a in args]
    out = backend.to_host(getattr(backend.ops, name)(*dev_args, **kwargs))
    ref_pool = pool.copy()
    expected = getattr(ref, name)(*(ref_pool if a is POOL else a for a in args), **kwargs)
    assert_close(out, expected, f"{name} output", tol_scale)
    assert_close(backend.to_host(dev_pool), ref_pool, f"{name} state pool (argument {pool_index})",
                 tol_scale)


class GdnContract:
    """causal_conv1d(_update), gated_delta_rule_(chunked|recurrent|decode), gdn_gating,
    rms_norm_gated, sigmoid_mul."""

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("bias,activation", [(True, "silu"), (False, None)])
    def test_causal_conv1d(self, backend, dtype, bias, activation):
        rng = make_rng("causal_conv1d", dtype, bias, activation)
        dim, k = 40, 4
        cu, seq_lens, slots = _layout(NUM_Q, CONTEXT, SLOTS)
        pool = _pool(rng, (NUM_SLOTS, k - 1, dim), seq_lens, NUM_Q, slots)
        args = (randn(rng, (int(cu[-1]), dim), dtype), randn(rng, (dim, k), dtype, 0.5),
                randn(rng, (dim,), dtype) if bias else None, POOL, cu, seq_lens, slots, activation)
        _check_stateful(backend, "causal_conv1d", args, pool, {})

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_causal_conv1d_update(self, backend, dtype):
        rng = make_rng("causal_conv1d_update", dtype)
        dim, k = 40, 4
        seq_lens, slots = np.array([7, 1, 3, 2], np.int32), np.array([3, 0, -1, 5], np.int32)
        pool = _pool(rng, (NUM_SLOTS, k - 1, dim), seq_lens, [1] * 4, slots)
        args = (randn(rng, (4, dim), dtype), randn(rng, (dim, k), dtype, 0.5),
                randn(rng, (dim,), dtype), POOL, seq_lens, slots, "silu")
        _check_stateful(backend, "causal_conv1d_update", args, pool, {})

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("heads", DELTA_HEADS)
    @pytest.mark.parametrize("layout", ["mixed", "decode"])
    def test_gated_delta_rule_chunked(self, backend, dtype, heads, layout):
        self._check_delta_rule(backend, "chunked", dtype, heads, layout)

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("heads", DELTA_HEADS)
    @pytest.mark.parametrize("layout", ["mixed", "decode"])
    def test_gated_delta_rule_recurrent(self, backend, dtype, heads, layout):
        self._check_delta_rule(backend, "recurrent", dtype, heads, layout)

    def _check_delta_rule(self, backend, form, dtype, heads, layout):
        rng = make_rng("gated_delta_rule", dtype, form, heads, layout)
        num_k, num_v, dk, dv = heads
        num_q, context, slot_list = ((NUM_Q, CONTEXT, SLOTS) if layout == "mixed"
                                     else ([1] * 4, [6, 0, 3, 1], [0, 5, -1, 3]))
        cu, seq_lens, slots = _layout(num_q, context, slot_list)
        n = int(cu[-1])
        g, beta = ref.gdn_gating(randn(rng, (n, 2 * num_v)), np.log(rng.uniform(0.5, 4, num_v)),
                                 randn(rng, (num_v,)))
        pool = _pool(rng, (NUM_SLOTS, num_v, dk, dv), seq_lens, num_q, slots)
        kwargs = dict(num_k_heads=num_k, num_v_heads=num_v, head_k_dim=dk, head_v_dim=dv)
        if form == "chunked":
            kwargs["chunk_size"] = 16
        args = (randn(rng, (n, 2 * num_k * dk + num_v * dv), dtype), g, beta, POOL, cu, seq_lens,
                slots)
        _check_stateful(backend, f"gated_delta_rule_{form}", args, pool, kwargs, RECURRENT_TOL_SCALE)

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("heads", DELTA_HEADS + [(2, 4, 128, 128)])
    def test_gated_delta_rule_decode(self, backend, dtype, heads):
        rng = make_rng("gated_delta_rule_decode", dtype, heads)
        num_k, num_v, dk, dv = heads
        k, conv_dim = 4, 2 * num_k * dk + num_v * dv
        cu, seq_lens, slots = _layout([1] * 4, [6, 0, 3, 1], [0, 5, -1, 3])
        pools = [_pool(rng, (NUM_SLOTS, k - 1, conv_dim), seq_lens, [1] * 4, slots),
                 _pool(rng, (NUM_SLOTS, num_v, dk, dv), seq_lens, [1] * 4, slots)]
        args = [randn(rng, (4, conv_dim), dtype), randn(rng, (4, num_v * dv), dtype),
                randn(rng, (4, 2 * num_v), dtype), randn(rng, (conv_dim, k), dtype, 0.5),
                np.log(rng.uniform(0.5, 4, num_v)).astype(np.float32),
                randn(rng, (num_v,)), randn(rng, (dv,), dtype)]
        kwargs = dict(num_k_heads=num_k, num_v_heads=num_v, head_k_dim=dk, head_v_dim=dv)
        dev_pools = [backend.from_host(p) for p in pools]
        out = backend.ops.gated_delta_rule_decode(
            *(to_device(backend, a) for a in args), *dev_pools,
            *(to_device(backend, a) for a in (cu, seq_lens, slots)), **kwargs)
        ref_pools = [p.copy() for p in pools]
        want = ref.gated_delta_rule_decode(*args, *ref_pools, cu, seq_lens, slots, **kwargs)
        assert_close(backend.to_host(out), want, "gated_delta_rule_decode output",
                     RECURRENT_TOL_SCALE)
        for name, dev, host in zip(("conv", "ssm"), dev_pools, ref_pools):
            assert_close(backend.to_host(dev), host, f"gated_delta_rule_decode {name} pool",
                         RECURRENT_TOL_SCALE)

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_gdn_gating(self, backend, dtype):
        rng = make_rng("gdn_gating", dtype)
        check_op(backend, "gdn_gating", randn(rng, (9, 8), dtype, 3.0),
                 np.log(rng.uniform(0.5, 8, 4)).astype(np.float32), randn(rng, (4,), dtype))

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_rms_norm_gated(self, backend, dtype):
        rng = make_rng("rms_norm_gated", dtype)
        check_op(backend, "rms_norm_gated", randn(rng, (7, 4, 32), dtype, 2.0),
                 randn(rng, (7, 4, 32), dtype, 2.0), randn(rng, (32,), dtype), 1e-6)

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("gate_width", [None, 1])
    def test_sigmoid_mul(self, backend, dtype, gate_width):
        rng = make_rng("sigmoid_mul", dtype, gate_width)
        check_op(backend, "sigmoid_mul", randn(rng, (6, 48), dtype),
                 randn(rng, (6, gate_width or 48), dtype, 3.0))
