"""NVFP4 KV-cache tests of :class:`~atlas_core.testing.contracts.GpuBackendContract`.

Run on backends that list ``nvfp4`` in :attr:`~atlas_core.interfaces.GpuBackend.kv_cache_dtypes`
(skipped elsewhere). The cache write must produce the reference's bytes exactly (the rule of
:mod:`atlas_core.ops.kv_quant`), untouched slots keep their bytes; attention over packed pools
is held to the activation dtype's tolerance against the reference reading the same bytes.
"""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.ops import reference as ref
from atlas_core.ops.kv_quant import nvfp4_row_bytes, quantize_kv_nvfp4
from atlas_core.ops.rotary import rope_cos_sin_cache
from atlas_core.testing.contracts_attention import PAGED_LAYOUTS, ROPE_CACHE_LAYOUTS, paged_case
from atlas_core.testing.contracts_ops import (BLOCK_SIZE, TOLERANCES, assert_close, make_rng,
                                              randn, to_device)

#: (num_heads, num_kv_heads, head_dim) of the nvfp4 cases: GQA 1, 4, 8; head dims 64, 128, 256.
NVFP4_LAYOUTS = [(4, 4, 64), (8, 2, 128), (8, 1, 256)]
#: A byte no cache write produces in these tests (codes 0xF / 0xF, scale 0x7F is NaN):
#: slots a write was not given must keep it.
SENTINEL = 0xAB


def nvfp4_cache(rng, num_blocks: int, num_kv_heads: int, head_dim: int,
                scale: float = 1.0) -> np.ndarray:
    """A packed pool ``[num_blocks, BLOCK_SIZE, num_kv_heads, head_dim/2 + head_dim/16]`` of
    quantized normal values (every slot valid, as attention may read any of them)."""
    values = rng.standard_normal((num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)) * scale
    return quantize_kv_nvfp4(values.astype(np.float32))


class KVNvfp4Contract:
    """reshape_and_cache, paged_attention and rope_cache_attention over nvfp4 (uint8) pools."""

    @pytest.fixture
    def nvfp4_backend(self, backend):
        if "nvfp4" not in getattr(backend, "kv_cache_dtypes", ()):
            pytest.skip(f"backend {backend.name} does not declare nvfp4 KV caches")
        return backend

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    @pytest.mark.parametrize("num_kv_heads,head_dim", [(2, 64), (1, 128), (4, 256)])
    def test_reshape_and_cache_nvfp4(self, nvfp4_backend, dtype, num_kv_heads, head_dim):
        backend = nvfp4_backend
        rng = make_rng("reshape_and_cache_nvfp4", dtype, num_kv_heads, head_dim)
        num_blocks, num_tokens = 5, 29
        slots = rng.permutation(num_blocks * BLOCK_SIZE)[:num_tokens].astype(np.int32)
        slots[[2, 17]] = -1
        shape = (num_tokens, num_kv_heads, head_dim)
        k, v = randn(rng, shape, dtype, 3.0), randn(rng, shape, dtype, 0.05)
        k[0, 0, :16] = 0  # an all-zero group
        v[1, 0, :16] = 1e-4  # a scale that rounds to 0
        k[3, 0, 16:32] = 5000  # a saturated scale
        cache_shape = (num_blocks, BLOCK_SIZE, num_kv_heads, nvfp4_row_bytes(head_dim))
        ref_k = np.full(cache_shape, SENTINEL, np.uint8)
        ref_v = ref_k.copy()
        dk, dv = backend.from_host(ref_k), backend.from_host(ref_v)
        backend.ops.reshape_and_cache(backend.from_host(k), backend.from_host(v), dk, dv,
                                      backend.from_host(slots))
        ref.reshape_and_cache(k, v, ref_k, ref_v, slots)
        for label, got, want in (("k_cache", dk, ref_k), ("v_cache", dv, ref_v)):
            got = backend.to_host(got)
            bad = np.argwhere(got != want)
            assert not len(bad), f"reshape_and_cache nvfp4 {label}: {len(bad)} bytes differ, " \
                f"first at {bad[0].tolist()}: {got[tuple(bad[0])]} vs {want[tuple(bad[0])]}"

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    @pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", NVFP4_LAYOUTS)
    @pytest.mark.parametrize("layout", ["decode", "chunked_prefill", "long"])
    def test_paged_attention_nvfp4(self, nvfp4_backend, dtype, num_heads, num_kv_heads, head_dim,
                                   layout):
        backend = nvfp4_backend
        rng = make_rng("paged_attention_nvfp4", dtype, num_heads, head_dim, layout)
        case = paged_case(rng, *PAGED_LAYOUTS[layout], spare_blocks=3)
        q = randn(rng, (int(case.cu_seqlens_q[-1]), num_heads, head_dim), dtype)
        k_cache = nvfp4_cache(rng, case.num_blocks, num_kv_heads, head_dim, 2.0)
        v_cache = nvfp4_cache(rng, case.num_blocks, num_kv_heads, head_dim)
        args = (case.block_tables, case.seq_lens, case.cu_seqlens_q, head_dim ** -0.5)
        got = backend.ops.paged_attention(backend.from_host(q), backend.from_host(k_cache),
                                          backend.from_host(v_cache),
                                          *(to_device(backend, a) for a in args))
        want = ref.paged_attention(q, k_cache, v_cache, *args)
        assert_close(backend.to_host(got), want, "paged_attention nvfp4")

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    @pytest.mark.parametrize("layout", ["decode", "chunked_prefill"])
    def test_rope_cache_attention_nvfp4(self, nvfp4_backend, dtype, layout):
        backend = nvfp4_backend
        num_heads, num_kv_heads, head_dim = 8, 2, 128
        rng = make_rng("rope_cache_attention_nvfp4", dtype, layout)
        case = paged_case(rng, *ROPE_CACHE_LAYOUTS[layout], spare_blocks=2,
                          pad_last=layout == "decode")
        num_blocks, slots = case.num_blocks, case.slot_mapping
        k_cache = nvfp4_cache(rng, num_blocks, num_kv_heads, head_dim)
        v_cache = nvfp4_cache(rng, num_blocks, num_kv_heads, head_dim)
        width = (num_heads + 2 * num_kv_heads) * head_dim
        qkv = randn(rng, (len(case.positions), width), dtype, 2.0)
        table = rope_cos_sin_cache(head_dim, 64, {"rope_type": "default", "rope_theta": 1e4})
        kwargs = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                      is_neox=True, eps=1e-6, q_norm=randn(rng, (head_dim,), dtype, 0.3) + 1,
                      k_norm=randn(rng, (head_dim,), dtype, 0.3) + 1)
        args = (qkv, case.positions, table)
        tail = (slots, case.block_tables, case.seq_lens, case.cu_seqlens_q, head_dim ** -0.5)
        dk, dv = backend.from_host(k_cache), backend.from_host(v_cache)
        got = backend.ops.rope_cache_attention(
            *(to_device(backend, a) for a in args), dk, dv, *(to_device(backend, a) for a in tail),
            **{key: to_device(backend, val) for key, val in kwargs.items()})
        want = ref.rope_cache_attention(*args, k_cache, v_cache, *tail, **kwargs)
        # a new key a rounding step off in the activation dtype may land on the neighbouring
        # e2m1 code (a step of up to 1/3 of one element): held to the fp8 cache tolerance
        assert_close(backend.to_host(got), want, "rope_cache_attention nvfp4",
                     max(1.0, TOLERANCES["float8_e4m3fn"] / TOLERANCES[dtype]))
        written = np.zeros(num_blocks * BLOCK_SIZE, bool)
        written[slots[slots >= 0]] = True
        for label, dev, host in (("k_cache", dk, k_cache), ("v_cache", dv, v_cache)):
            got_rows = backend.to_host(dev).reshape(num_blocks * BLOCK_SIZE, -1)
            want_rows = host.reshape(num_blocks * BLOCK_SIZE, -1)
            assert (got_rows[~written] == want_rows[~written]).all(), \
                f"rope_cache_attention nvfp4 changed {label} slots it was not given"
            # the fused prologue may round q/k norm and rotary differently: a few codes move
            same = (got_rows[written] == want_rows[written]).mean()
            assert same >= 0.98, \
                f"rope_cache_attention nvfp4 {label}: only {same:.3f} of the bytes match"
