"""KV-cache and attention tests of :class:`~atlas_core.testing.contracts.GpuBackendContract`.

In-place ops write into NaN-poisoned caches: every slot they are given must become finite and
match the reference, every other slot must still be NaN.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

from atlas_core.ops import reference as ref
from atlas_core.ops._dtypes import as_dtype
from atlas_core.ops.rotary import rope_cos_sin_cache
from atlas_core.testing.contracts_ops import (BLOCK_SIZE, DTYPES, TOLERANCES, assert_close,
                                              check_op, make_block_tables, make_rng, poisoned,
                                              randn, rel_error, to_device)

#: (num_heads, num_kv_heads, head_dim): GQA ratios 1, 2, 4, 8 and head dims 64, 128.
HEAD_LAYOUTS = [(4, 4, 64), (4, 2, 128), (8, 2, 64), (8, 1, 128)]
#: Context lengths crossing 16-token block boundaries.
SEQ_LENS = [1, 16, 17, 40]
#: Dtypes of the head dims only tensor-core kernels take (80).
HALF_DTYPES = ("bfloat16", "float16")
#: ``layout -> (seq_lens, query rows a sequence)`` of the paged-attention cases.
PAGED_LAYOUTS = {
    "decode": (SEQ_LENS, [1] * len(SEQ_LENS)),
    # prefix-cached chunks, a first chunk, a sequence with no query this step
    "chunked_prefill": ([17, 9, 40, 33, 5], [1, 0, 16, 17, 5]),
    # several splits of a split-KV decode kernel
    "long": ([700, 2100, 65], [1, 1, 1]),
}
#: ``layout -> (seq_lens, query rows a sequence)`` of the fused rope + cache + attention cases;
#: the last decode row is CUDA-graph padding (:func:`paged_case`'s ``pad_last``).
ROPE_CACHE_LAYOUTS = {
    "decode": ([1, 16, 17, 40, 3], [1] * 5),
    "chunked_prefill": ([17, 9, 40, 5], [1, 0, 16, 5]),
}


class PagedCase(NamedTuple):
    """The step metadata of a paged-attention case (int32 host arrays)."""

    seq_lens: np.ndarray
    num_blocks: int
    block_tables: np.ndarray
    cu_seqlens_q: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray


def paged_case(rng, seq_lens: list[int], num_q: list[int], spare_blocks: int,
               pad_last: bool = False) -> PagedCase:
    """Shuffled block tables for ``seq_lens`` in a pool ``spare_blocks`` larger than they need,
    and the positions and cache slots of each sequence's last ``num_q`` tokens; with
    ``pad_last`` the last row is padding (slot ``-1``). Shared by the dense and the nvfp4 cache
    contracts, so both cover the same layouts (only the block tables draw from ``rng``)."""
    num_blocks = sum(-(-n // BLOCK_SIZE) for n in seq_lens) + spare_blocks
    tables = make_block_tables(rng, seq_lens, num_blocks)
    positions = np.concatenate([np.arange(n - q, n) for n, q in zip(seq_lens, num_q)])
    seq_of = np.repeat(np.arange(len(seq_lens)), num_q)
    slots = (tables[seq_of, positions // BLOCK_SIZE] * BLOCK_SIZE
             + positions % BLOCK_SIZE).astype(np.int32)
    if pad_last:
        slots[-1] = -1
    cu = np.concatenate([[0], np.cumsum(num_q)]).astype(np.int32)
    return PagedCase(np.array(seq_lens, np.int32), num_blocks, tables, cu,
                     positions.astype(np.int32), slots)


class AttentionContract:
    """reshape_and_cache, prefill_attention (causal and bidirectional), paged_attention,
    qk_norm_rope_and_cache."""

    @pytest.mark.parametrize("dtype,cache_dtype,kv_scale",
                             [("float32", "float32", 1.0), ("bfloat16", "bfloat16", 1.0),
                              ("bfloat16", "float8_e4m3fn", 0.5), ("float32", "float8_e4m3fn", 2.0)])
    def test_reshape_and_cache(self, backend, dtype, cache_dtype, kv_scale):
        rng = make_rng("reshape_and_cache", dtype, cache_dtype)
        num_blocks, num_tokens = 6, 23
        slots = rng.permutation(num_blocks * BLOCK_SIZE)[:num_tokens].astype(np.int32)
        slots[[3, 11]] = -1
        k, v = randn(rng, (num_tokens, 2, 64), dtype), randn(rng, (num_tokens, 2, 64), dtype)
        self._check_cache_write(backend, "reshape_and_cache", (k, v), {}, slots, cache_dtype,
                                num_blocks, (2, 64), kv_scale)

    def _check_cache_write(self, backend, name, args, kwargs, slots, cache_dtype, num_blocks,
                           head_shape, kv_scale, cache_after_args=True):
        shape = (num_blocks, BLOCK_SIZE, *head_shape)
        k_cache, v_cache = backend.from_host(poisoned(shape, cache_dtype)), \
            backend.from_host(poisoned(shape, cache_dtype))
        ref_k, ref_v = poisoned(shape, cache_dtype), poisoned(shape, cache_dtype)
        dev_args = [to_device(backend, a) for a in args]
        dev_kw = {key: to_device(backend, val) for key, val in kwargs.items()}
        out = getattr(backend.ops, name)(*dev_args, k_cache, v_cache, backend.from_host(slots),
                                         kv_scale=kv_scale, **dev_kw)
        expected = getattr(ref, name)(*args, ref_k, ref_v, slots, kv_scale=kv_scale, **kwargs)
        written = np.zeros(num_blocks * BLOCK_SIZE, dtype=bool)
        written[slots[slots >= 0]] = True
        for label, got, want in (("k_cache", k_cache, ref_k), ("v_cache", v_cache, ref_v)):
            got = backend.to_host(got).reshape(num_blocks * BLOCK_SIZE, -1).astype(np.float32)
            want = want.reshape(num_blocks * BLOCK_SIZE, -1).astype(np.float32)
            assert np.isnan(got[~written]).all(), f"{name} wrote {label} slots it was not given"
            assert np.isfinite(got[written]).all(), f"{name} left {label} slots unwritten"
            err = rel_error(got[written], want[written])
            assert err <= TOLERANCES[cache_dtype], f"{name} {label}: relative error {err:.2e}"
        return out if out is None else (backend.to_host(out), expected)

    @pytest.mark.parametrize("causal", [True, False])
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", HEAD_LAYOUTS)
    def test_prefill_attention(self, backend, dtype, num_heads, num_kv_heads, head_dim, causal):
        self._check_prefill(backend, dtype, num_heads, num_kv_heads, head_dim, causal,
                            [1, 17, 33, 5])

    @pytest.mark.parametrize("causal", [True, False])
    @pytest.mark.parametrize("dtype", HALF_DTYPES)
    @pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2)])
    def test_prefill_attention_head_dim_80(self, backend, dtype, num_heads, num_kv_heads, causal):
        """Head dim 80 (vision towers' 72, zero-padded to a multiple of 16) in half precision;
        a sequence of over two 64-row tiles, one shorter than a tile."""
        self._check_prefill(backend, dtype, num_heads, num_kv_heads, 80, causal, [150, 9, 64])

    def _check_prefill(self, backend, dtype, num_heads, num_kv_heads, head_dim, causal, lens):
        rng = make_rng("prefill_attention", dtype, num_heads, num_kv_heads, head_dim, causal)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        n = int(cu[-1])
        check_op(backend, "prefill_attention", randn(rng, (n, num_heads, head_dim), dtype),
                 randn(rng, (n, num_kv_heads, head_dim), dtype),
                 randn(rng, (n, num_kv_heads, head_dim), dtype), cu, head_dim ** -0.5,
                 causal=causal)

    @pytest.mark.parametrize("dtype,cache_dtype,kv_scale",
                             [("float32", "float32", 1.0), ("bfloat16", "bfloat16", 1.0),
                              ("bfloat16", "float8_e4m3fn", 0.7), ("float32", "float8_e4m3fn", 1.0)])
    @pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", HEAD_LAYOUTS)
    @pytest.mark.parametrize("layout", ["decode", "chunked_prefill"])
    def test_paged_attention(self, backend, dtype, cache_dtype, kv_scale, num_heads, num_kv_heads,
                             head_dim, layout):
        rng = make_rng("paged_attention", dtype, cache_dtype, num_heads, num_kv_heads, head_dim,
                       layout)
        case = paged_case(rng, *PAGED_LAYOUTS[layout], spare_blocks=3)
        cache_shape = (case.num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
        q = randn(rng, (int(case.cu_seqlens_q[-1]), num_heads, head_dim), dtype)
        check_op(backend, "paged_attention", q, randn(rng, cache_shape, cache_dtype),
                 randn(rng, cache_shape, cache_dtype), case.block_tables, case.seq_lens,
                 case.cu_seqlens_q, head_dim ** -0.5, kv_scale)

    def test_paged_attention_matches_prefill(self, backend):
        """Attention over a freshly cached prompt equals prefill attention over the same tokens."""
        rng = make_rng("paged_vs_prefill")
        seq_lens = [17, 33]
        num_blocks = 6
        tables = make_block_tables(rng, seq_lens, num_blocks)
        cu = np.array([0, 17, 50], dtype=np.int32)
        q, k, v = (randn(rng, (50, 8, 64)), randn(rng, (50, 2, 64)), randn(rng, (50, 2, 64)))
        slots = np.concatenate([tables[b, np.arange(n) // BLOCK_SIZE] * BLOCK_SIZE
                                + np.arange(n) % BLOCK_SIZE for b, n in enumerate(seq_lens)])
        k_cache = backend.zeros((num_blocks, BLOCK_SIZE, 2, 64), np.float32)
        v_cache = backend.zeros((num_blocks, BLOCK_SIZE, 2, 64), np.float32)
        dq, dk, dv = (backend.from_host(a) for a in (q, k, v))
        backend.ops.reshape_and_cache(dk, dv, k_cache, v_cache,
                                      backend.from_host(slots.astype(np.int32)))
        paged = backend.ops.paged_attention(dq, k_cache, v_cache, backend.from_host(tables),
                                            backend.from_host(np.array(seq_lens, np.int32)),
                                            backend.from_host(cu), 0.125)
        prefill = backend.ops.prefill_attention(dq, dk, dv, backend.from_host(cu), 0.125)
        assert_close(backend.to_host(paged), backend.to_host(prefill), "paged vs prefill")

    @pytest.mark.parametrize("dtype,cache_dtype", [("float32", "float32"), ("bfloat16", "bfloat16"),
                                                   ("bfloat16", "float8_e4m3fn")])
    @pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,rotary_dim,norms",
                             [(4, 4, 64, None, True), (8, 2, 128, 64, False),
                              (8, 1, 64, 32, True), (4, 2, 128, None, False)])
    def test_qk_norm_rope_and_cache(self, backend, dtype, cache_dtype, num_heads, num_kv_heads,
                                    head_dim, rotary_dim, norms):
        rng = make_rng("qk_norm_rope_and_cache", dtype, cache_dtype, num_heads, head_dim, norms)
        num_tokens, num_blocks = 21, 4
        width = (num_heads + 2 * num_kv_heads) * head_dim
        cache = rope_cos_sin_cache(rotary_dim or head_dim, 512, {"rope_type": "default",
                                                                 "rope_theta": 1e6})
        slots = rng.permutation(num_blocks * BLOCK_SIZE)[:num_tokens].astype(np.int32)
        slots[5] = -1
        kwargs = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                      rotary_dim=rotary_dim, is_neox=bool(norms), eps=1e-6,
                      q_norm=randn(rng, (head_dim,), dtype, 0.3) + 1 if norms else None,
                      k_norm=randn(rng, (head_dim,), dtype, 0.3) + 1 if norms else None)
        args = (randn(rng, (num_tokens, width), dtype, 2.0),
                rng.integers(0, 512, num_tokens).astype(np.int32), cache)
        kv_scale = 0.5 if cache_dtype == "float8_e4m3fn" else 1.0
        got, want = self._check_cache_write(backend, "qk_norm_rope_and_cache", args, kwargs, slots,
                                            cache_dtype, num_blocks, (num_kv_heads, head_dim),
                                            kv_scale)
        assert_close(got, want, "qk_norm_rope_and_cache q")

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    @pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,k_eq_v",
                             [(8, 4, 256, False), (8, 2, 512, True), (4, 1, 64, True)])
    def test_qk_norm_rope_and_cache_value_norm(self, backend, dtype, num_heads, num_kv_heads,
                                               head_dim, k_eq_v):
        """Gemma-4's prologue: the value heads RMS-normed (its weightless norm: ones) and, on
        full-attention layers, the values taken from the key projection before its norm and
        rotary."""
        rng = make_rng("qk_norm_rope_and_cache_vn", dtype, num_heads, head_dim, k_eq_v)
        num_tokens, num_blocks = 13, 3
        width = (num_heads + (1 if k_eq_v else 2) * num_kv_heads) * head_dim
        cache = rope_cos_sin_cache(head_dim, 512, {"rope_type": "default", "rope_theta": 1e4})
        slots = rng.permutation(num_blocks * BLOCK_SIZE)[:num_tokens].astype(np.int32)
        slots[3] = -1
        kwargs = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                      rotary_dim=head_dim, is_neox=True, eps=1e-6,
                      q_norm=randn(rng, (head_dim,), dtype, 0.3) + 1,
                      k_norm=randn(rng, (head_dim,), dtype, 0.3) + 1,
                      v_norm=np.ones(head_dim, dtype=as_dtype(dtype)), k_eq_v=k_eq_v)
        args = (randn(rng, (num_tokens, width), dtype, 2.0),
                rng.integers(0, 512, num_tokens).astype(np.int32), cache)
        got, want = self._check_cache_write(backend, "qk_norm_rope_and_cache", args, kwargs, slots,
                                            dtype, num_blocks, (num_kv_heads, head_dim), 1.0)
        assert_close(got, want, "qk_norm_rope_and_cache q (value norm)")

    @pytest.mark.parametrize("dtype,cache_dtype,kv_scale",
                             [("float32", "float32", 1.0), ("bfloat16", "bfloat16", 1.0),
                              ("bfloat16", "float8_e4m3fn", 0.5)])
    @pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,rotary_dim,norms",
                             [(8, 2, 128, None, True), (4, 4, 64, 32, False)])
    @pytest.mark.parametrize("layout", ["decode", "chunked_prefill"])
    def test_rope_cache_attention(self, backend, dtype, cache_dtype, kv_scale, num_heads,
                                  num_kv_heads, head_dim, rotary_dim, norms, layout):
        rng = make_rng("rope_cache_attention", dtype, cache_dtype, num_heads, layout)
        case = paged_case(rng, *ROPE_CACHE_LAYOUTS[layout], spare_blocks=2,
                          pad_last=layout == "decode")
        cache_shape = (case.num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
        k_cache = randn(rng, cache_shape, cache_dtype)
        v_cache = randn(rng, cache_shape, cache_dtype)
        width = (num_heads + 2 * num_kv_heads) * head_dim
        qkv = randn(rng, (len(case.positions), width), dtype, 2.0)
        table = rope_cos_sin_cache(rotary_dim or head_dim, 64, {"rope_type": "default",
                                                                "rope_theta": 1e4})
        kwargs = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                      rotary_dim=rotary_dim, is_neox=bool(norms), eps=1e-6,
                      q_norm=randn(rng, (head_dim,), dtype, 0.3) + 1 if norms else None,
                      k_norm=randn(rng, (head_dim,), dtype, 0.3) + 1 if norms else None)
        args = (qkv, case.positions, table)
        tail = (case.slot_mapping, case.block_tables, case.seq_lens, case.cu_seqlens_q,
                head_dim ** -0.5, kv_scale)
        dk, dv = backend.from_host(k_cache), backend.from_host(v_cache)
        got = backend.ops.rope_cache_attention(
            *(to_device(backend, a) for a in args), dk, dv, *(to_device(backend, a) for a in tail),
            **{key: to_device(backend, val) for key, val in kwargs.items()})
        want = ref.rope_cache_attention(*args, k_cache, v_cache, *tail, **kwargs)
        # an fp8 cache: a new key a rounding step off in the activation dtype can land on the
        # neighbouring fp8 value, so the output is held to the cache's tolerance
        assert_close(backend.to_host(got), want, "rope_cache_attention",
                     max(1.0, TOLERANCES[cache_dtype] / TOLERANCES[dtype]))
        for label, dev, host in (("k_cache", dk, k_cache), ("v_cache", dv, v_cache)):
            err = rel_error(backend.to_host(dev).astype(np.float32), host.astype(np.float32))
            assert err <= TOLERANCES[cache_dtype], f"rope_cache_attention {label}: error {err:.2e}"
