"""Attention-side ops of the cuda backend: rotary, KV-cache writes, paged and prefill attention."""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.ops._dtypes import float8_e4m3fn
from atlas_cuda import env as cuda_env
from atlas_cuda.array import DeviceArray
from atlas_cuda.kernels_loader import variant_of

LOG2E = 1.4426950408889634
HEAD_DIMS = (16, 32, 64, 128, 256)
FP8_HEAD_DIMS = (64, 128, 256)
FLASH_HEAD_DIMS = (64, 128)
FLASH_BM = FLASH_BN = 64


class AttentionOps:
    """Mixed into :class:`atlas_cuda.ops.CudaOps`."""

    def _rope(self, q_out, k_out, v_out, q, k, v, strides, positions, cos_sin_cache, slots,
              q_norm, k_norm, heads, eps, rotary_dim, is_neox, kv_scale) -> None:
        num_heads, num_kv_heads, head_dim = heads
        t = positions.shape[0]
        if not t:
            return
        warps = min(8, num_heads + 2 * num_kv_heads)
        norm_dtype = q_norm.dtype if q_norm is not None else q.dtype
        if norm_dtype not in (q.dtype, np.float32):
            raise TypeError(f"qk_norm_rope_and_cache: q/k norm weights in {norm_dtype}; use "
                            f"{q.dtype} or float32")
        name = "rope_qkv" + _cache_suffix(k_out, q) + ("" if norm_dtype == q.dtype else "_nf32")
        kern = self._k("rope_cache", q.dtype, name)
        self._launch(kern, t, 32 * warps, q_out, k_out, v_out, q, k, v,
                     *(np.int64(s) for s in strides), positions, cos_sin_cache, slots, q_norm,
                     k_norm, num_heads, num_kv_heads, head_dim, int(rotary_dim or head_dim),
                     int(is_neox), float(eps), float(1.0 / kv_scale), shmem=warps * head_dim * 4)

    def rotary_embedding(self, q: DeviceArray, k: DeviceArray, positions: DeviceArray,
                         cos_sin_cache: DeviceArray, rotary_dim: int | None = None,
                         is_neox: bool = True):
        t, h, d = q.shape
        kh = k.shape[1]
        q_out, k_out = self._out(q.shape, q.dtype), self._out(k.shape, k.dtype)
        self._rope(q_out, k_out, None, q, k, None, (h * d, kh * d, 0), positions, cos_sin_cache,
                   None, None, None, (h, kh, d), 1e-6, rotary_dim, is_neox, 1.0)
        return q_out, k_out

    def _check_cache(self, name: str, k: DeviceArray, k_cache: DeviceArray) -> None:
        if k_cache.dtype not in (k.dtype, float8_e4m3fn):
            raise TypeError(f"{name}: the cuda backend stores the KV cache in the activation dtype "
                            f"({k.dtype}) or float8_e4m3fn, not {k_cache.dtype}")

    def reshape_and_cache(self, k: DeviceArray, v: DeviceArray, k_cache: DeviceArray,
                          v_cache: DeviceArray, slot_mapping: DeviceArray,
                          kv_scale: float = 1.0) -> None:
        self._check_cache("reshape_and_cache", k, k_cache)
        t = k.shape[0]
        if t:
            name = "reshape_and_cache" + _cache_suffix(k_cache, k)
            self._launch(self._k("rope_cache", k.dtype, name), t, 128, k_cache,
                         v_cache, k, v, slot_mapping, k.size // t, float(1.0 / kv_scale))

    def qk_norm_rope_and_cache(self, qkv: DeviceArray, positions: DeviceArray,
                               cos_sin_cache: DeviceArray, k_cache: DeviceArray,
                               v_cache: DeviceArray, slot_mapping: DeviceArray, *, num_heads: int,
                               num_kv_heads: int, head_dim: int, q_norm: DeviceArray | None = None,
                               k_norm: DeviceArray | None = None, eps: float = 1e-6,
                               rotary_dim: int | None = None, is_neox: bool = True,
                               kv_scale: float = 1.0) -> DeviceArray:
        self._check_cache("qk_norm_rope_and_cache", qkv, k_cache)
        t = qkv.shape[0]
        q_out = self._out((t, num_heads, head_dim), qkv.dtype)
        item = qkv.dtype.itemsize
        k = DeviceArray(qkv.ptr + num_heads * head_dim * item, (t,), qkv.dtype, qkv.owner)
        v = DeviceArray(k.ptr + num_kv_heads * head_dim * item, (t,), qkv.dtype, qkv.owner)
        row = (num_heads + 2 * num_kv_heads) * head_dim
        self._rope(q_out, k_cache, v_cache, qkv, k, v, (row, row, row), positions, cos_sin_cache,
                   slot_mapping, q_norm, k_norm, (num_heads, num_kv_heads, head_dim), eps,
                   rotary_dim, is_neox, kv_scale)
        return q_out

    def _attention(self, q, k, v, block_tables, seq_lens, cu_seqlens, num_seqs, num_kv_heads,
                   block_size, max_ctx, scale, kv_scale) -> DeviceArray:
        t, h, d = q.shape
        if d not in HEAD_DIMS:
            raise ValueError(f"attention: head_dim {d} unsupported on cuda (use one of {HEAD_DIMS})")
        out = self._out(q.shape, q.dtype)
        if not t:
            return out
        if self._use_flash(q, k, num_seqs):
            self._flash(out, q, k, v, block_tables, seq_lens, cu_seqlens, num_seqs, num_kv_heads,
                        block_size, scale)
            return out
        group = h // num_kv_heads
        hb = next(b for b in (8, 4, 2, 1) if group % b == 0)
        base = t * num_kv_heads * (group // hb)
        splits = max(1, min(-(-2 * self.be.num_sms // base), max_ctx // 256, 64))
        part_acc = part_ml = None
        if splits > 1:
            part_acc = self._out((t * h * splits * d,), np.float32)
            part_ml = self._out((t * h * splits * 2,), np.float32)
        var = variant_of(q.dtype)
        fp8 = _cache_suffix(k, q)
        if fp8 and d not in FP8_HEAD_DIMS:
            raise ValueError(f"attention: a float8_e4m3fn KV cache needs head_dim in "
                             f"{FP8_HEAD_DIMS} on cuda (got {d})")
        kern = self.be.kernels.kernel("attention", var, f"attn{fp8}_{var}_d{d}_h{hb}")
        max_blocks = block_tables.shape[1] if block_tables is not None else 0
        self._launch(kern, (t, num_kv_heads * (group // hb), splits), 128, out, part_acc,
                     part_ml, q, k, v, block_tables, seq_lens, cu_seqlens, h, num_kv_heads,
                     block_size, max_blocks, num_seqs, splits, float(scale * LOG2E),
                     float(kv_scale))
        if splits > 1:
            self._launch(self._k("attention", q.dtype, "attn_combine"), (t, h), min(d, 128),
                         out, part_acc, part_ml, d, splits, float(kv_scale))
        return out

    def _use_flash(self, q: DeviceArray, k: DeviceArray, num_seqs: int) -> bool:
        """Tensor-core kernel for multi-token batches (>= 4 query tokens per sequence on
        average) in bf16/f16 with head_dim 64/128; decode batches keep the split-K kernel."""
        t, _, d = q.shape
        return (q.dtype.name in ("bfloat16", "float16") and k.dtype == q.dtype
                and d in FLASH_HEAD_DIMS and t >= 4 * max(num_seqs, 1)
                and cuda_env.attention_mode() != "simt")

    def _flash(self, out, q, k, v, block_tables, seq_lens, cu_seqlens, num_seqs, num_kv_heads,
               block_size, scale) -> None:
        t, h, d = q.shape
        var = variant_of(q.dtype)
        shmem = (FLASH_BM + 4 * FLASH_BN) * (d + 8) * q.dtype.itemsize
        kern = self.be.kernels.kernel("flash_attention", var, f"flash_{var}_d{d}", shmem)
        max_blocks = block_tables.shape[1] if block_tables is not None else 0
        self._launch(kern, (-(-t // FLASH_BM) + num_seqs, h), 128, out, q, k, v, block_tables,
                     seq_lens, cu_seqlens, h, num_kv_heads, block_size, max_blocks, num_seqs,
                     float(scale * LOG2E), shmem=shmem)

    def paged_attention(self, q: DeviceArray, k_cache: DeviceArray, v_cache: DeviceArray,
                        block_tables: DeviceArray, seq_lens: DeviceArray,
                        cu_seqlens_q: DeviceArray, scale: float,
                        kv_scale: float = 1.0) -> DeviceArray:
        self._check_cache("paged_attention", q, k_cache)
        _, block_size, num_kv_heads, _ = k_cache.shape
        max_ctx = block_tables.shape[1] * block_size
        return self._attention(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
                               seq_lens.shape[0], num_kv_heads, block_size, max_ctx, scale,
                               kv_scale)

    def prefill_attention(self, q: DeviceArray, k: DeviceArray, v: DeviceArray,
                          cu_seqlens: DeviceArray, scale: float) -> DeviceArray:
        return self._attention(q, k, v, None, None, cu_seqlens, cu_seqlens.shape[0] - 1,
                               k.shape[1], 1, max(q.shape[0], 1), scale, 1.0)


def _cache_suffix(cache: DeviceArray | None, act: DeviceArray) -> str:
    """``"_fp8"`` for a float8_e4m3fn KV cache (kernel name suffix), else ``""``."""
    return "_fp8" if cache is not None and cache.dtype == float8_e4m3fn and act.dtype != cache.dtype else ""
