"""Per-op batch invariance of the numpy backend: a row's (or a sequence's) result is the same
bits alone, inside any batch, at any position, and however its sequence is split into steps."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.ops._dtypes import bfloat16

pytestmark = pytest.mark.timeout(60)


def bits(a) -> bytes:
    return np.ascontiguousarray(a).tobytes()


@pytest.fixture
def ops():
    return NumpyBackend().ops


def windows(total: int):
    """``(start, size)`` sub-batches: single rows, small and odd batches, the whole batch."""
    for size in (1, 2, 3, 5, 8, 13, total):
        for start in sorted({0, 1, total - size}):
            if 0 <= start <= total - size:
                yield start, size


@pytest.mark.parametrize("dtype", [np.float32, bfloat16])
@pytest.mark.parametrize("k, n", [(64, 384), (37, 5), (200, 130)])
def test_linear_rows_do_not_depend_on_the_batch(ops, dtype, k, n):
    rng = np.random.default_rng(k)
    x = rng.standard_normal((40, k)).astype(dtype)
    w = (rng.standard_normal((n, k)) * 0.1).astype(dtype)
    alone = [bits(ops.linear(x[r:r + 1], w)) for r in range(len(x))]
    for start, size in windows(len(x)):
        y = ops.linear(x[start:start + size], w)
        assert [bits(y[i:i + 1]) for i in range(size)] == alone[start:start + size]


def test_moe_experts_rows_do_not_depend_on_the_batch(ops):
    rng = np.random.default_rng(1)
    t, hidden, experts, inter = 24, 64, 8, 32
    x = rng.standard_normal((t, hidden)).astype(np.float32)
    w_gate_up = (rng.standard_normal((experts, 2 * inter, hidden)) * 0.1).astype(np.float32)
    w_down = (rng.standard_normal((experts, hidden, inter)) * 0.1).astype(np.float32)
    weights, ids = ops.moe_route(rng.standard_normal((t, experts)).astype(np.float32), 2, True)
    full = ops.moe_experts(x, w_gate_up, w_down, weights, ids)
    for start, size in windows(t):
        s = slice(start, start + size)
        assert bits(ops.moe_experts(x[s], w_gate_up, w_down, weights[s], ids[s])) == bits(full[s])


def _attention_case(cache_dtype):
    rng = np.random.default_rng(2)
    num_blocks, block_size, kv_heads, heads, head_dim = 32, 8, 2, 4, 16
    k_cache = rng.standard_normal((num_blocks, block_size, kv_heads, head_dim)).astype(cache_dtype)
    v_cache = rng.standard_normal((num_blocks, block_size, kv_heads, head_dim)).astype(cache_dtype)
    tables = rng.permutation(num_blocks)[:24].reshape(3, 8).astype(np.int32)
    lengths = (41, 9, 60)
    # q[s][p]: the query of sequence s at position p
    q = [rng.standard_normal((n, heads, head_dim)).astype(np.float32) for n in lengths]
    return k_cache, v_cache, tables, lengths, q


def _attend(ops, case, chunks):
    """``chunks``: ``(seq, start, end)`` query ranges of one step -> output per chunk."""
    k_cache, v_cache, tables, _, q = case
    q_step = np.concatenate([q[s][a:b] for s, a, b in chunks])
    cu = np.cumsum([0] + [b - a for _, a, b in chunks]).astype(np.int32)
    out = ops.paged_attention(q_step, k_cache, v_cache, tables[[s for s, _, _ in chunks]],
                              np.array([b for _, _, b in chunks], np.int32), cu, 0.25)
    return [out[cu[i]:cu[i + 1]] for i in range(len(chunks))]


@pytest.mark.parametrize("cache_dtype", [bfloat16, np.float32])
def test_paged_attention_rows_same_in_decode_mixed_and_prefill_steps(ops, cache_dtype):
    case = _attention_case(cache_dtype)
    lengths = case[3]
    one_shot = [_attend(ops, case, [(s, 0, n)])[0] for s, n in enumerate(lengths)]

    def expect(s, a, b):
        return bits(one_shot[s][a:b])

    decode_only = _attend(ops, case, [(0, 40, 41), (1, 8, 9), (2, 59, 60)])
    assert [bits(o) for o in decode_only] == [expect(0, 40, 41), expect(1, 8, 9), expect(2, 59, 60)]
    mixed = _attend(ops, case, [(0, 40, 41), (2, 13, 37), (1, 8, 9)])
    assert [bits(o) for o in mixed] == [expect(0, 40, 41), expect(2, 13, 37), expect(1, 8, 9)]
    chunked = _attend(ops, case, [(2, 37, 60), (0, 3, 29)])
    assert [bits(o) for o in chunked] == [expect(2, 37, 60), expect(0, 3, 29)]


def _gdn_case():
    rng = np.random.default_rng(3)
    hk, hv, dk, dv = 2, 4, 16, 16
    lengths = (23, 7, 12)
    t = sum(lengths)
    qkv = rng.standard_normal((t, 2 * hk * dk + hv * dv)).astype(bfloat16)
    g = -np.abs(rng.standard_normal((t, hv))).astype(np.float32) * 0.3
    beta = (1 / (1 + np.exp(-rng.standard_normal((t, hv))))).astype(np.float32)
    starts = np.cumsum((0,) + lengths)[:-1]
    heads = dict(num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv)
    return qkv, g, beta, lengths, starts, heads


def _gdn_steps(ops, case, steps):
    """Run ``steps`` (lists of ``(seq, start, end)``); per sequence its outputs and final state."""
    qkv, g, beta, lengths, starts, heads = case
    pool = np.zeros((len(lengths), heads["num_v_heads"], heads["head_k_dim"], heads["head_v_dim"]),
                    np.float32)
    outs = {s: [] for s in range(len(lengths))}
    for chunks in steps:
        rows = np.concatenate([np.arange(starts[s] + a, starts[s] + b) for s, a, b in chunks])
        cu = np.cumsum([0] + [b - a for _, a, b in chunks]).astype(np.int32)
        seq_lens = np.array([b for _, _, b in chunks], np.int32)
        slots = np.array([s for s, _, _ in chunks], np.int32)
        decode = all(b - a == 1 for _, a, b in chunks)
        op = ops.gated_delta_rule_recurrent if decode else ops.gated_delta_rule_chunked
        out = op(qkv[rows], g[rows], beta[rows], pool, cu, seq_lens, slots, **heads)
        for i, (s, _, _) in enumerate(chunks):
            outs[s].append(out[cu[i]:cu[i + 1]])
    return {s: bits(np.concatenate(o)) + bits(pool[s]) for s, o in outs.items() if o}


def test_gated_delta_rule_same_however_sequences_are_split_and_batched(ops):
    case = _gdn_case()
    lengths = case[3]
    alone = {s: _gdn_steps(ops, case, [[(s, 0, n)]])[s] for s, n in enumerate(lengths)}
    split = _gdn_steps(ops, case, [
        [(0, 0, 9), (1, 0, 7)],
        [(0, 9, 10), (2, 0, 5)],
        [(0, 10, 17), (2, 5, 6)],
        [(0, 17, 23), (2, 6, 12)],
    ])
    assert split == alone
    token_by_token = _gdn_steps(ops, case, [[(1, i, i + 1)] for i in range(lengths[1])])
    assert token_by_token[1] == alone[1]


@pytest.mark.parametrize("m", [1, 3, 70, 71])
def test_threaded_matmul_changes_no_bits(monkeypatch, m):
    from atlas_core.backends import numpy_gemm

    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, 96)).astype(np.float32)
    w = rng.standard_normal((203, 96)).astype(np.float32)
    serial = numpy_gemm.matmul_nt(x, w)
    monkeypatch.setattr(numpy_gemm, "_PARALLEL_MIN_MACS", 0)
    monkeypatch.setattr(numpy_gemm, "_workers", lambda: 4)
    assert bits(numpy_gemm.matmul_nt(x, w)) == bits(serial)
