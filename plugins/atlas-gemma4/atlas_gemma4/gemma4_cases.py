"""Contract cases of the Gemma-4 ops, named by their specs (``OpSpec(cases=...)``). Imported only
by tests: the generated contract test runs them on every backend that has the op."""

from __future__ import annotations

import numpy as np

from atlas_core.api import as_dtype, quantize
from atlas_core.testing.contracts_cases import OpCase
from atlas_core.testing.contracts_ops import DTYPES, make_rng, randn


def mul_cases() -> list[OpCase]:
    """A scalar, a per-feature vector, a per-row column and a full operand, in every dtype."""
    cases = []
    for dtype in DTYPES:
        rng = make_rng("mul", dtype)
        x = randn(rng, (7, 64), dtype)
        for label, other in (("scalar", randn(rng, (1,), dtype)), ("row", randn(rng, (64,), dtype)),
                             ("column", randn(rng, (7, 1), "float32")),
                             ("full", randn(rng, (7, 64), dtype))):
            cases.append(OpCase(f"{dtype}-{label}", (x, other)))
    return cases


def softcap_cases() -> list[OpCase]:
    """Values inside the cap, around it and saturating."""
    cases = []
    for dtype in DTYPES:
        for shape, cap, scale in (((5, 384), 30.0, 10.0), ((3, 7), 1.0, 4.0)):
            x = randn(make_rng("softcap", dtype, shape), shape, dtype, scale)
            cases.append(OpCase(f"{dtype}-{shape[0]}x{shape[1]}-cap{cap:g}", (x, cap)))
    return cases


def sliding_window_attention_cases() -> list[OpCase]:
    """Decode rows and prefill chunks of sequences shorter and longer than the window, GQA."""
    cases = []
    block_size, num_blocks, kv_heads, heads, head_dim = 4, 24, 2, 4, 16
    for dtype in DTYPES:
        for window in (3, 8, 64):
            rng = make_rng("sliding_window_attention", dtype, window)
            seq_lens = np.array([1, 9, 22, 13], dtype=np.int32)
            q_lens = np.array([1, 9, 1, 5], dtype=np.int32)
            cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
            tables = rng.permutation(num_blocks).reshape(4, 6).astype(np.int32)
            cache = (num_blocks, block_size, kv_heads, head_dim)
            args = (randn(rng, (int(cu[-1]), heads, head_dim), dtype), randn(rng, cache, dtype),
                    randn(rng, cache, dtype), tables, seq_lens, cu, head_dim ** -0.5, window)
            cases.append(OpCase(f"{dtype}-window{window}", args))
        # decode-heavy rows at head size 64 (cuda: the core's windowed decode kernel)
        rng = make_rng("sliding_window_attention-d64", dtype)
        seq_lens, q_lens = np.array([1, 40, 22, 13], np.int32), np.array([1, 1, 1, 5], np.int32)
        cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        tables = rng.permutation(64).reshape(4, 16).astype(np.int32)
        cache = (64, block_size, kv_heads, 64)
        args = (randn(rng, (int(cu[-1]), heads, 64), dtype), randn(rng, cache, dtype),
                randn(rng, cache, dtype), tables, seq_lens, cu, 64 ** -0.5, 8)
        cases.append(OpCase(f"{dtype}-d64-decode-window8", args))
    return cases


#: ``ffn_in`` cases: rows, width, intermediate size, experts' norm, zero-centred, activation,
#: gate/up bias. 26B-A4B's width (2,816: a thread's second chunk ends mid-block) at 1 and 8
#: rows (cuda's fused kernel at up to gemv_rows rows), narrow rows of a dense and a Gemma-3
#: block (silu too: the op serves any gated MLP).
_FFN_IN = ((1, 2816, 64, True, False, "gelu_tanh", False),
           (8, 2816, 32, True, False, "gelu_tanh", False),
           (3, 384, 48, False, True, "gelu_tanh", False),
           (1, 384, 48, True, True, "silu", True),
           (3, 264, 40, True, False, "silu", False),
           (1, 264, 40, False, False, None, False))


def ffn_in_cases() -> list[OpCase]:
    """:data:`_FFN_IN` in every dtype, plus a quantized (``fp8_block``) gate/up at one row (cuda
    composes it from the separate ops)."""
    cases = []
    for dtype in DTYPES:
        for rows, d, inter, experts, zc, act, bias in _FFN_IN:
            rng = make_rng("ffn_in", dtype, rows, d, experts, zc, act)
            w = [randn(rng, (d,), dtype, 0.5) for _ in range(3)]
            gate_up = randn(rng, (2 * inter, d), dtype, d ** -0.5)
            args = (randn(rng, (rows, d), dtype, 3.0), randn(rng, (rows, d), dtype), w[0], w[1],
                    w[2] if experts else None, 1e-6, gate_up,
                    randn(rng, (2 * inter,), dtype, 0.1) if bias else None, zc, act)
            cases.append(OpCase(f"{dtype}-{rows}x{d}-{'moe' if experts else 'dense'}"
                                f"{'-zc' if zc else ''}-{act}{'-bias' if bias else ''}", args))
    for dtype in DTYPES:  # last: a backend that keeps no fp8_block weights skips from here on
        rng = make_rng("ffn_in-fp8", dtype)
        gate_up = quantize(rng.standard_normal((96, 256)).astype(np.float32) / 16, "fp8_block",
                           block_size=(128, 128), dtype=as_dtype(dtype))
        args = (randn(rng, (1, 256), dtype, 3.0), randn(rng, (1, 256), dtype),
                *(randn(rng, (256,), dtype, 0.5) for _ in range(3)), 1e-6, gate_up)
        cases.append(OpCase(f"{dtype}-1x256-moe-fp8", args))
    return cases


def ffn_out_cases() -> list[OpCase]:
    """A MoE block's end (two norms, then the post norm), a dense block's, with and without
    ``layer_scalar``, zero-centred norm weights (Gemma-3), rows of a width past one block's
    first pass."""
    cases = []
    for dtype in DTYPES:
        for rows, d in ((1, 2816), (5, 384)):
            rng = make_rng("ffn_out", dtype, rows, d)
            x = [randn(rng, (rows, d), dtype) for _ in range(3)]
            w = [randn(rng, (d,), dtype, 0.5) for _ in range(3)]
            scalar = randn(rng, (1,), dtype)
            cases.append(OpCase(f"{dtype}-moe-{rows}x{d}",
                                (x[0], x[1], w[0], x[2], w[1], w[2], scalar, 1e-6)))
            cases.append(OpCase(f"{dtype}-dense-{rows}x{d}",
                                (x[0], x[1], None, None, None, w[2], scalar, 1e-6)))
            cases.append(OpCase(f"{dtype}-gemma3-{rows}x{d}",
                                (x[0], x[1], None, None, None, w[2], None, 1e-6, True)))
    return cases


def mul_gathered_cases() -> list[OpCase]:
    """Top-k weights (float32) times a per-expert scale in every dtype."""
    cases = []
    for dtype in DTYPES:
        rng = make_rng("mul_gathered", dtype)
        for tokens, k, e in ((1, 8, 128), (7, 2, 4)):
            weights = randn(rng, (tokens, k), "float32")
            ids = rng.integers(0, e, size=(tokens, k)).astype(np.int32)
            cases.append(OpCase(f"{dtype}-{tokens}x{k}-of-{e}",
                                (weights, ids, randn(rng, (e,), dtype))))
    return cases
