"""Contract cases of the weight-taking ops with quantized weights, every format.

Registered as the ``cases`` of ``linear``, ``linear_act_and_mul``, ``rms_norm_linear``,
``moe_experts``, ``moe_block`` and ``rms_norm_moe_block`` (:mod:`atlas_core.ops.plugin`), each
with the op's plain-weight cases of :mod:`atlas_core.testing.contracts_core_cases`, so
:class:`~atlas_core.testing.contracts_cases.GeneratedOpContract` runs them on every backend:
a case whose weight format the backend does not keep (``backend.quantized_weight_formats``)
is skipped, naming the format. Shapes are those kernels meet: 1 row (decode GEMV) and 33 rows,
FP8 blocks of 128 x 128 with a partial last block row, NVFP4 groups of 16.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atlas_core.ops._dtypes import as_dtype
from atlas_core.ops.quant import FORMATS, QuantizedWeight, quantize
from atlas_core.testing.contracts_cases import OpCase
from atlas_core.testing.contracts_ops import make_rng, randn

DTYPES = ("float32", "bfloat16")
ROWS = (1, 33)
BLOCK = (128, 128)


def quantized_to_device(backend: Any, w: QuantizedWeight) -> QuantizedWeight:
    """``w`` with its arrays uploaded to ``backend``; skips the test when the backend does not
    keep ``w.format`` weights."""
    formats = getattr(backend, "quantized_weight_formats", ()) or ()
    if w.format not in formats:
        pytest.skip(f"the {backend.name} backend keeps no {w.format} weights "
                    f"(quantized_weight_formats: {sorted(formats) or 'none'})")
    return w.replace(**{k: backend.from_host(np.asarray(getattr(w, k), order="C"))
                        for k in ("data", "scale", "global_scale") if getattr(w, k) is not None})


def _weight(rng, shape, fmt, dtype) -> QuantizedWeight:
    w = rng.standard_normal(shape).astype(np.float32) / np.sqrt(shape[-1])
    return quantize(w, fmt, block_size=BLOCK, dtype=as_dtype(dtype))


def _core(name: str) -> list[OpCase]:
    from atlas_core.testing import contracts_core_cases
    provider = getattr(contracts_core_cases, f"{name}_cases", None)
    return list(provider()) if provider is not None else []


def linear_cases() -> list[OpCase]:
    """``linear(x, w, bias)``: ``[rows, 256] x [192, 256]``, with and without a bias."""
    cases = _core("linear")
    for fmt in FORMATS:
        for dtype in DTYPES:
            for rows in ROWS:
                rng = make_rng("linear_quant", fmt, dtype, rows)
                bias = randn(rng, (192,), dtype) if rows > 1 else None
                cases.append(OpCase(f"quant-{fmt}-{dtype}-m{rows}",
                                    (randn(rng, (rows, 256), dtype),
                                     _weight(rng, (192, 256), fmt, dtype), bias)))
    return cases


def linear_act_and_mul_cases() -> list[OpCase]:
    """``linear_act_and_mul`` over a quantized ``[gate; up]`` of ``[2 * 160, 256]``."""
    cases = _core("linear_act_and_mul")
    for fmt in FORMATS:
        for dtype in DTYPES:
            for rows in ROWS:
                rng = make_rng("linear_act_and_mul_quant", fmt, dtype, rows)
                cases.append(OpCase(f"quant-{fmt}-{dtype}-m{rows}",
                                    (randn(rng, (rows, 256), dtype),
                                     _weight(rng, (320, 256), fmt, dtype), None, "silu")))
    return cases


def rms_norm_linear_cases() -> list[OpCase]:
    """``rms_norm_linear`` with a residual, plain and with the gated activation."""
    cases = _core("rms_norm_linear")
    for fmt in FORMATS:
        for dtype in DTYPES:
            for activation in (None, "silu"):
                rng = make_rng("rms_norm_linear_quant", fmt, dtype, activation)
                cases.append(OpCase(f"quant-{fmt}-{dtype}-{activation}", (
                    randn(rng, (7, 256), dtype), randn(rng, (7, 256), dtype),
                    (1 + 0.1 * randn(rng, (256,), "float32")).astype(as_dtype(dtype)),
                    1e-6, _weight(rng, (320, 256), fmt, dtype), None, False, activation)))
    return cases


def _moe_args(rng, fmt, dtype, rows, experts=4, hidden=256, inter=160):
    x = randn(rng, (rows, hidden), dtype)
    return x, _weight(rng, (experts, 2 * inter, hidden), fmt, dtype), \
        _weight(rng, (experts, hidden, inter), fmt, dtype)


def moe_experts_cases() -> list[OpCase]:
    """``moe_experts`` with quantized stacked experts (4 experts, top-2)."""
    cases = _core("moe_experts")
    for fmt in FORMATS:
        for dtype in DTYPES:
            for rows in ROWS:
                rng = make_rng("moe_experts_quant", fmt, dtype, rows)
                x, w1, w2 = _moe_args(rng, fmt, dtype, rows)
                ids = np.stack([rng.permutation(4)[:2] for _ in range(rows)]).astype(np.int32)
                weights = rng.uniform(0.1, 1.0, (rows, 2)).astype(np.float32)
                cases.append(OpCase(f"quant-{fmt}-{dtype}-m{rows}",
                                    (x, w1, w2, weights, ids, "silu")))
    return cases


def moe_block_cases() -> list[OpCase]:
    """``moe_block`` with quantized experts and a quantized gated shared expert."""
    cases = _core("moe_block")
    for fmt in FORMATS:
        for dtype in DTYPES:
            rng = make_rng("moe_block_quant", fmt, dtype)
            x, w1, w2 = _moe_args(rng, fmt, dtype, 7)
            router = randn(rng, (4, 256), dtype)
            cases.append(OpCase(f"quant-{fmt}-{dtype}", (x, router, w1, w2, 2, True), dict(
                shared_gate_up=_weight(rng, (2 * 160, 256), fmt, dtype),
                shared_down=_weight(rng, (256, 160), fmt, dtype),
                shared_gate=randn(rng, (1, 256), dtype))))
    return cases


def rms_norm_moe_block_cases() -> list[OpCase]:
    """``rms_norm_moe_block`` with quantized experts."""
    cases = _core("rms_norm_moe_block")
    for fmt in FORMATS:
        for dtype in DTYPES:
            rng = make_rng("rms_norm_moe_block_quant", fmt, dtype)
            x, w1, w2 = _moe_args(rng, fmt, dtype, 7)
            norm = (1 + 0.1 * randn(rng, (256,), "float32")).astype(x.dtype)
            cases.append(OpCase(f"quant-{fmt}-{dtype}", (x, randn(rng, (7, 256), dtype), norm, 1e-6,
                                                   False, randn(rng, (4, 256), dtype), w1, w2, 2,
                                                   True)))
    return cases
