"""Contract cases of the core elementwise, norm, rotary and MoE ops, named by their specs
(:mod:`atlas_core.ops.plugin`) and run on every backend by
:class:`~atlas_core.testing.contracts_cases.GeneratedOpContract`.

Every case draws fresh random inputs seeded from the case, so failures reproduce.
"""

from __future__ import annotations

import itertools

import numpy as np

from atlas_core.ops import reference as ref
from atlas_core.ops._dtypes import as_dtype
from atlas_core.ops.rotary import rope_cos_sin_cache
from atlas_core.testing.contracts_cases import OpCase
from atlas_core.testing.contracts_ops import DTYPES, make_rng, randn

ALL_DTYPES = ("float32", "bfloat16", "float16")


def _id(*parts) -> str:
    return "-".join(str(p) for p in parts)


def embedding_cases() -> list[OpCase]:
    """First, last and random rows of small and wide tables."""
    cases = []
    for dtype in DTYPES:
        for vocab, hidden in ((37, 64), (1000, 96)):
            rng = make_rng("embedding", dtype, vocab, hidden)
            ids = np.concatenate([[0, vocab - 1], rng.integers(0, vocab, 9)]).astype(np.int32)
            cases.append(OpCase(_id(dtype, vocab, hidden),
                                (ids, randn(rng, (vocab, hidden), dtype))))
    return cases


def rms_norm_cases() -> list[OpCase]:
    """2-D and 3-D rows, a 4,096-wide row; with residual, zero-centred weights."""
    cases = []
    for dtype in ALL_DTYPES:
        for shape in ((7, 96), (2, 5, 64), (1, 4096)):
            for residual, zc in ((False, False), (True, False), (True, True)):
                rng = make_rng("rms_norm", dtype, shape, residual, zc)
                res = randn(rng, shape, dtype) if residual else None
                args = (randn(rng, shape, dtype, 3.0), randn(rng, shape[-1:], dtype, 0.5), 1e-6,
                        res)
                cases.append(OpCase(_id(dtype, "x".join(map(str, shape)), int(residual), int(zc)),
                                    args, {"zero_centered": zc}))
    return cases


def linear_act_and_mul_cases() -> list[OpCase]:
    """Decode and prefill rows, unaligned K, bias, both activations."""
    cases = []
    for dtype in ALL_DTYPES:
        for x_shape, d, bias, activation in (((1, 64), 48, False, "silu"),
                                             ((3, 1032), 24, True, "silu"),
                                             ((2, 3, 2056), 16, False, "gelu_tanh"),
                                             ((13, 100), 20, True, "silu"),
                                             ((9, 64), 40, False, "gelu_tanh")):
            rng = make_rng("linear_act_and_mul", dtype, x_shape, d, bias, activation)
            w = randn(rng, (2 * d, x_shape[-1]), dtype, 2 * x_shape[-1] ** -0.5)
            b = randn(rng, (2 * d,), dtype) if bias else None
            cases.append(OpCase(_id(dtype, "x".join(map(str, x_shape)), d, int(bias), activation),
                                (randn(rng, x_shape, dtype), w, b, activation)))
    return cases


def rms_norm_linear_cases() -> list[OpCase]:
    """With and without residual, zero-centred weights, a gated activation after."""
    cases = []
    for dtype in DTYPES:
        for rows, k, n, bias in ((1, 64, 96, False), (3, 1032, 40, True), (8, 512, 72, False),
                                 (13, 96, 37, True)):
            for residual, zc, act in ((True, False, None), (False, False, None),
                                      (True, True, "silu"), (True, False, "gelu_tanh")):
                rng = make_rng("rms_norm_linear", dtype, rows, k, n, bias, residual, zc, act)
                n_w = 2 * n if act else n
                w = randn(rng, (n_w, k), dtype, k ** -0.5)
                b = randn(rng, (n_w,), dtype) if bias else None
                res = randn(rng, (rows, k), dtype) if residual else None
                args = (randn(rng, (rows, k), dtype, 3.0), res, randn(rng, (k,), dtype, 0.5), 1e-6,
                        w, b, zc, act)
                cases.append(OpCase(_id(dtype, rows, k, n, int(bias), int(residual), int(zc), act),
                                    args))
    return cases


def add_cases() -> list[OpCase]:
    """2-D and 3-D shapes."""
    cases = []
    for dtype in DTYPES:
        for shape in ((7, 33), (2, 3, 128)):
            rng = make_rng("add", dtype, shape)
            cases.append(OpCase(_id(dtype, "x".join(map(str, shape))),
                                (randn(rng, shape, dtype), randn(rng, shape, dtype))))
    return cases


def _act_cases(seed: str) -> list[OpCase]:
    return [OpCase(_id(dtype, "x".join(map(str, shape))),
                   (randn(make_rng(seed, dtype, shape), shape, dtype, 2.0),))
            for dtype in DTYPES for shape in ((5, 96), (2, 3, 34))]


def silu_and_mul_cases() -> list[OpCase]:
    """Aligned and unaligned halves."""
    return _act_cases("silu")


def gelu_tanh_and_mul_cases() -> list[OpCase]:
    """Aligned and unaligned halves."""
    return _act_cases("gelu")


def sigmoid_mul_cases() -> list[OpCase]:
    """A full gate and a broadcast ``[rows, 1]`` gate."""
    cases = []
    for dtype in DTYPES:
        for width in (48, 1):
            rng = make_rng("sigmoid_mul", dtype, width)
            cases.append(OpCase(f"{dtype}-gate{width}", (randn(rng, (6, 48), dtype),
                                                          randn(rng, (6, width), dtype, 3.0))))
    return cases


def rotary_embedding_cases() -> list[OpCase]:
    """Full and partial rotary dims, NeoX and GPT-J layouts."""
    cases = []
    for dtype in DTYPES:
        for head_dim, rotary_dim in ((64, None), (128, 128), (128, 64), (64, 32)):
            for is_neox in (True, False):
                rng = make_rng("rotary", dtype, head_dim, rotary_dim, is_neox)
                cache = rope_cos_sin_cache(rotary_dim or head_dim, 600,
                                           {"rope_type": "default", "rope_theta": 10000.0})
                positions = rng.integers(0, 600, 11).astype(np.int32)
                args = (randn(rng, (11, 8, head_dim), dtype), randn(rng, (11, 2, head_dim), dtype),
                        positions, cache, rotary_dim, is_neox)
                cases.append(OpCase(_id(dtype, head_dim, rotary_dim, int(is_neox)), args))
    return cases


def moe_route_cases() -> list[OpCase]:
    """Softmax and sigmoid scoring, with and without renormalisation, top-1 to top-4."""
    cases = []
    for dtype in DTYPES:
        for num_experts, top_k, renormalize, scoring in ((8, 2, True, "softmax"),
                                                         (16, 4, False, "softmax"),
                                                         (8, 1, False, "softmax"),
                                                         (16, 2, True, "sigmoid")):
            rng = make_rng("moe_route", dtype, num_experts, top_k, renormalize, scoring)
            # Well-separated logits, so the chosen experts do not hinge on rounding.
            logits = np.stack([rng.permutation(num_experts) for _ in range(9)]) * 0.25
            logits = (logits + rng.uniform(-0.01, 0.01, logits.shape)).astype(as_dtype(dtype))
            cases.append(OpCase(_id(dtype, num_experts, top_k, int(renormalize), scoring),
                                (logits, top_k, renormalize, scoring)))
    return cases


def moe_experts_cases() -> list[OpCase]:
    """Few and all experts per token, both activations."""
    cases = []
    for dtype in DTYPES:
        for num_experts, top_k, activation in ((4, 2, "silu"), (8, 2, "gelu_tanh"),
                                               (8, 8, "silu")):
            rng = make_rng("moe_experts", dtype, num_experts, top_k, activation)
            tokens, hidden, inter = 11, 64, 48
            weights, ids = ref.moe_route(randn(rng, (tokens, num_experts)), top_k, True)
            args = (randn(rng, (tokens, hidden), dtype),
                    randn(rng, (num_experts, 2 * inter, hidden), dtype, hidden ** -0.5),
                    randn(rng, (num_experts, hidden, inter), dtype, inter ** -0.5), weights, ids,
                    activation)
            cases.append(OpCase(_id(dtype, num_experts, top_k, activation), args))
    return cases


def moe_block_cases() -> list[OpCase]:
    """Decode and prefill token counts, with and without a gated shared expert, both scorings."""
    cases = []
    for dtype in DTYPES:
        for tokens, num_experts, top_k, shared, scoring in (
                (1, 16, 4, 0, "softmax"), (3, 8, 2, 24, "softmax"), (8, 64, 8, 48, "softmax"),
                (11, 16, 2, 40, "softmax"), (2, 16, 4, 32, "sigmoid")):
            rng = make_rng("moe_block", dtype, tokens, num_experts, top_k, shared, scoring)
            hidden, inter = 64, 40
            x, router = separated_router(rng, dtype, tokens, hidden, num_experts, top_k)
            experts, kw = moe_block_weights(rng, dtype, num_experts, hidden, inter, shared)
            cases.append(OpCase(_id(dtype, tokens, num_experts, top_k, shared, scoring),
                                (x, router, *experts, top_k, True, scoring, "silu"), kw))
    return cases


def rms_norm_moe_block_cases() -> list[OpCase]:
    """The pre-norm with and without residual, zero-centred weights, a shared expert."""
    cases = []
    for dtype in DTYPES:
        for tokens, num_experts, top_k, shared, residual, zc in (
                (1, 16, 4, 0, True, False), (3, 8, 2, 24, True, True),
                (8, 64, 8, 48, False, False)):
            rng = make_rng("rms_norm_moe_block", dtype, tokens, num_experts, top_k, shared,
                           residual, zc)
            hidden, inter = 64, 40
            x = randn(rng, (tokens, hidden), dtype, 3.0)
            res = randn(rng, (tokens, hidden), dtype) if residual else None
            nw = randn(rng, (hidden,), dtype, 0.5)
            normed = ref.rms_norm(x, nw, 1e-6, res, zero_centered=zc)
            normed = normed[0] if residual else normed
            _, router = separated_router(rng, dtype, tokens, hidden, num_experts, top_k, x=normed)
            experts, kw = moe_block_weights(rng, dtype, num_experts, hidden, inter, shared)
            args = (x, res, nw, 1e-6, zc, router, *experts, top_k, True, "softmax", "silu")
            cases.append(OpCase(_id(dtype, tokens, num_experts, top_k, shared, int(residual),
                                    int(zc)), args, kw))
    return cases


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


#: Random redraws before a router is moved onto a separated one (draws with given inputs
#: found one only after ~10^5 tries, 15 s per call).
_REDRAWS = 500


def separated_router(rng, dtype, tokens, hidden, num_experts, top_k, x=None):
    """Inputs and router whose top-k choice does not hinge on rounding (the k-th and (k+1)-th
    logits of every token at least 0.05 apart); ``x``: keep these inputs, draw only routers."""
    given = x
    for attempt in itertools.count(1):
        x = randn(rng, (tokens, hidden), dtype) if given is None else given
        router = randn(rng, (num_experts, hidden), dtype, hidden ** -0.5)
        if attempt >= _REDRAWS:
            router = _lift_top_k(x, router, top_k)
        if _top_k_gap(x, router, top_k) > 0.05:
            return x, router


def _top_k_gap(x, router, top_k) -> float:
    logits = -np.sort(-(x.astype(np.float64) @ router.astype(np.float64).T), axis=-1)
    return float(np.min(logits[:, top_k - 1] - logits[:, top_k])) if top_k < len(router) else 1.0


def _lift_top_k(x, router, top_k):
    """``router`` plus the least-norm change that raises each token's top-k logits by 0.1
    (exact when the tokens' inputs are linearly independent)."""
    x64, r64 = x.astype(np.float64), router.astype(np.float64)
    logits = x64 @ r64.T
    lift = np.zeros_like(logits)
    np.put_along_axis(lift, np.argsort(-logits, axis=-1)[:, :top_k], 0.1, axis=-1)
    return (r64 + (np.linalg.pinv(x64) @ lift).T).astype(router.dtype)
