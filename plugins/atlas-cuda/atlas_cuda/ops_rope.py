"""Rotary embedding and KV-cache writes of the cuda backend (``rope_cache.cu``, ``rope_vec.cu``,
the nvfp4 packing of :mod:`atlas_cuda.ops_kv_nvfp4`): the base of
:class:`~atlas_cuda.ops_attention.AttentionOps`, whose fused rope + decode attention reuses
:meth:`RopeCacheOps._rope`."""

from __future__ import annotations

import numpy as np

from atlas_core.api import float8_e4m3fn
from atlas_cuda import ops_kv_nvfp4 as nvfp4
from atlas_cuda.array import DeviceArray

#: Head dims of the register-resident rope prologue (``rope_vec.cu``, policy ``rope=vec``).
ROPE_VEC_HEAD_DIMS = (256, 512)


class RopeCacheOps:
    """``rotary_embedding``, ``reshape_and_cache`` and ``qk_norm_rope_and_cache`` (the op
    table binds them through :class:`~atlas_cuda.ops_attention.AttentionOps`, which derives
    from this class); needs ``self.ctx``, the backend's
    :class:`~atlas_cuda.context.OpContext`."""

    def _rope(self, q_out, k_out, v_out, q, k, v, strides, positions, cos_sin_cache, slots,
              q_norm, k_norm, heads, eps, rotary_dim, is_neox, kv_scale, v_norm=None) -> None:
        num_heads, num_kv_heads, head_dim = heads
        t = positions.shape[0]
        if not t:
            return
        rows = num_heads + (2 if v is not None else 1) * num_kv_heads
        warps = min(4, rows)
        groups = -(-rows // warps)
        norms = [n for n in (q_norm, k_norm, v_norm) if n is not None]
        norm_dtype = norms[0].dtype if norms else q.dtype
        if norm_dtype not in (q.dtype, np.float32) or any(n.dtype != norm_dtype for n in norms):
            raise TypeError(f"qk_norm_rope_and_cache: norm weights in "
                            f"{sorted({str(n.dtype) for n in norms})}; use one of {q.dtype} or "
                            "float32 for all of them")
        vn = () if v_norm is None else (v_norm,)
        suffix = (("_vn" if vn else "") + cache_suffix(k_out, q)
                  + ("" if norm_dtype == q.dtype else "_nf32"))
        if self._rope_vec(head_dim, rotary_dim, q, k, v, strides):
            # rope_vec.cu: a head's elements in a lane's registers (also the v-norm-less form:
            # its v_norm argument is null)
            kern = self.ctx.kernel("rope_vec", q.dtype, f"rope_vec{suffix}_d{head_dim}")
            self.ctx.launch(kern, (t, groups), 32 * warps, q_out, k_out, v_out, q, k, v,
                            *(np.int64(s) for s in strides), positions, cos_sin_cache, slots,
                            q_norm, k_norm, v_norm, num_heads, num_kv_heads, head_dim,
                            int(rotary_dim or head_dim), int(is_neox), float(eps),
                            float(1.0 / kv_scale), pdl=self.ctx.pdl)
            return
        kern = self.ctx.kernel("rope_cache", q.dtype, "rope_qkv" + suffix)
        self.ctx.launch(kern, (t, groups), 32 * warps, q_out, k_out, v_out, q, k, v,
                        *(np.int64(s) for s in strides), positions, cos_sin_cache, slots, q_norm,
                        k_norm, *vn, num_heads, num_kv_heads, head_dim, int(rotary_dim or head_dim),
                        int(is_neox), float(eps), float(1.0 / kv_scale), shmem=warps * head_dim * 4,
                        pdl=self.ctx.pdl)

    def _rope_vec(self, d: int, rotary_dim: int | None, q, k, v, strides) -> bool:
        """Whether policy ``rope`` (``vec`` or ``auto``) takes ``rope_vec.cu`` here: head dims
        of :data:`ROPE_VEC_HEAD_DIMS`, a rotary width that splits into whole lanes (a multiple
        of ``2 * d / 32``), 16-byte aligned rows. H200 batch 1, 1,024 tokens, gemma-4-26b-a4b
        (session 23): 3.68 ms a step with the generic kernel, 3.54 with this one."""
        if self.ctx.policy.rope == "generic" or d not in ROPE_VEC_HEAD_DIMS:
            return False
        rot = int(rotary_dim or d)
        return (rot % (2 * (d // 32)) == 0 and all(s % 8 == 0 for s in strides)
                and all(a.ptr % 16 == 0 for a in (q, k, v) if a is not None))

    def rotary_embedding(self, q: DeviceArray, k: DeviceArray, positions: DeviceArray,
                         cos_sin_cache: DeviceArray, rotary_dim: int | None = None,
                         is_neox: bool = True):
        t, h, d = q.shape
        kh = k.shape[1]
        q_out, k_out = self.ctx.out(q.shape, q.dtype), self.ctx.out(k.shape, k.dtype)
        self._rope(q_out, k_out, None, q, k, None, (h * d, kh * d, 0), positions, cos_sin_cache,
                   None, None, None, (h, kh, d), 1e-6, rotary_dim, is_neox, 1.0)
        return q_out, k_out

    def _check_cache(self, name: str, k: DeviceArray, k_cache: DeviceArray) -> None:
        if k_cache.dtype not in (k.dtype, float8_e4m3fn, nvfp4.NVFP4):
            raise TypeError(f"{name}: the cuda backend stores the KV cache in the activation dtype "
                            f"({k.dtype}), float8_e4m3fn or uint8 (nvfp4), not {k_cache.dtype}")

    def reshape_and_cache(self, k: DeviceArray, v: DeviceArray, k_cache: DeviceArray,
                          v_cache: DeviceArray, slot_mapping: DeviceArray,
                          kv_scale: float = 1.0) -> None:
        self._check_cache("reshape_and_cache", k, k_cache)
        if nvfp4.is_nvfp4(k_cache):
            return nvfp4.write(self.ctx, k, v, k_cache, v_cache, slot_mapping, kv_scale)
        t = k.shape[0]
        if t:
            name = "reshape_and_cache" + cache_suffix(k_cache, k)
            self.ctx.launch(self.ctx.kernel("rope_cache", k.dtype, name), t, 128, k_cache,
                            v_cache, k, v, slot_mapping, k.size // t, float(1.0 / kv_scale),
                            pdl=self.ctx.pdl)

    def qk_norm_rope_and_cache(self, qkv: DeviceArray, positions: DeviceArray,
                               cos_sin_cache: DeviceArray, k_cache: DeviceArray,
                               v_cache: DeviceArray, slot_mapping: DeviceArray, *, num_heads: int,
                               num_kv_heads: int, head_dim: int, q_norm: DeviceArray | None = None,
                               k_norm: DeviceArray | None = None, eps: float = 1e-6,
                               rotary_dim: int | None = None, is_neox: bool = True,
                               kv_scale: float = 1.0, v_norm: DeviceArray | None = None,
                               k_eq_v: bool = False) -> DeviceArray:
        self._check_cache("qk_norm_rope_and_cache", qkv, k_cache)
        t = qkv.shape[0]
        q_out = self.ctx.out((t, num_heads, head_dim), qkv.dtype)
        item = qkv.dtype.itemsize
        k = DeviceArray(qkv.ptr + num_heads * head_dim * item, (t,), qkv.dtype, qkv.owner)
        v = k if k_eq_v else DeviceArray(k.ptr + num_kv_heads * head_dim * item, (t,), qkv.dtype,
                                         qkv.owner)
        row = (num_heads + (1 if k_eq_v else 2) * num_kv_heads) * head_dim
        heads = (num_heads, num_kv_heads, head_dim)
        if nvfp4.is_nvfp4(k_cache):  # rope into dense rows (no slots: every token), then pack
            dense = (t, num_kv_heads, head_dim)
            k_rows, v_rows = self.ctx.out(dense, qkv.dtype), self.ctx.out(dense, qkv.dtype)
            self._rope(q_out, k_rows, v_rows, qkv, k, v, (row, row, row), positions,
                       cos_sin_cache, None, q_norm, k_norm, heads, eps, rotary_dim, is_neox, 1.0,
                       v_norm)
            nvfp4.write(self.ctx, k_rows, v_rows, k_cache, v_cache, slot_mapping, kv_scale)
            return q_out
        self._rope(q_out, k_cache, v_cache, qkv, k, v, (row, row, row), positions, cos_sin_cache,
                   slot_mapping, q_norm, k_norm, heads, eps, rotary_dim, is_neox, kv_scale,
                   v_norm)
        return q_out


def cache_suffix(cache: DeviceArray | None, act: DeviceArray) -> str:
    """``"_fp8"`` for a float8_e4m3fn KV cache, ``"_nvfp4"`` for packed nvfp4 rows (kernel name
    suffixes), else ``""``."""
    if nvfp4.is_nvfp4(cache):
        return "_nvfp4"
    fp8 = cache is not None and cache.dtype == float8_e4m3fn and act.dtype != cache.dtype
    return "_fp8" if fp8 else ""
