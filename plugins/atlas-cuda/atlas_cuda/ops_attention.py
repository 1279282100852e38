"""Attention ops of the cuda backend: paged decode and prefill attention, and rope fused with
decode attention (the rotary and KV-cache writes they build on: :mod:`atlas_cuda.ops_rope`)."""

from __future__ import annotations

import numpy as np

from atlas_core.api import compose_rope_cache_attention
from atlas_cuda import ops_kv_nvfp4 as nvfp4
from atlas_cuda.array import DeviceArray
from atlas_cuda.attention_plan import (
    LONG_DECODE_CTX, MMA_DECODE_B1_MAX_CTX, MMA_DECODE_B1_MAX_CTX_ODD, MMA_DECODE_MIN_CTX,
    MMA_DECODE_ODD_HEADS, MMA_DECODE_STAGES, MMA_DECODE_STATIC,
    batch_invariant_decode_plan, decode_plan, mma_decode_heads, mma_merge_plan,
    mma_decode_plan, mma_decode_smem, shared_decode_plan)
from atlas_cuda.context import OpContext
from atlas_cuda.kernels_loader import variant_of
from atlas_cuda.ops_rope import RopeCacheOps, cache_suffix

LOG2E = 1.4426950408889634
HEAD_DIMS = (16, 32, 64, 128, 256)
FP8_HEAD_DIMS = (64, 128, 256)
#: Head dims of the split decode kernel over nvfp4 rows (``attn_dec_nvfp4_*``).
NVFP4_HEAD_DIMS = (64, 128, 256)
#: Head dims of the tensor-core kernel (80: vision towers' 72 padded to a multiple of 16).
FLASH_HEAD_DIMS = (64, 80, 128)
#: Head dims of the fused rope + decode attention kernel (at 256 its per-block prologue cost
#: more than the saved launch from 4K context on, H200), and the most decode tokens it takes.
ROPE_DECODE_HEAD_DIMS = (64, 128)
ROPE_DECODE_MAX_TOKENS = 8
FLASH_BM = FLASH_BN = 64
#: Head dims of the sliding-window decode kernel (``attn_dec_swa_*``, :meth:`window_decode`).
SWA_HEAD_DIMS = (64, 128, 256)


class AttentionOps(RopeCacheOps):
    """Decode (split) and prefill (flash) attention, on top of the rotary embedding and
    KV-cache writes of :class:`~atlas_cuda.ops_rope.RopeCacheOps`.

    Args:
        ctx: the backend's :class:`~atlas_cuda.context.OpContext`.
    """

    def __init__(self, ctx: OpContext) -> None:
        self.ctx = ctx
        self._nvfp4_scratch = nvfp4.GatherScratch()

    def rope_cache_attention(self, qkv: DeviceArray, positions: DeviceArray,
                             cos_sin_cache: DeviceArray, k_cache: DeviceArray,
                             v_cache: DeviceArray, slot_mapping: DeviceArray,
                             block_tables: DeviceArray, seq_lens: DeviceArray,
                             cu_seqlens_q: DeviceArray, scale: float, kv_scale: float = 1.0, *,
                             num_heads: int, num_kv_heads: int, head_dim: int,
                             q_norm: DeviceArray | None = None,
                             k_norm: DeviceArray | None = None, eps: float = 1e-6,
                             rotary_dim: int | None = None, is_neox: bool = True) -> DeviceArray:
        """One kernel on decode steps (as many tokens as sequences, at most
        :data:`ROPE_DECODE_MAX_TOKENS`, head dims :data:`ROPE_DECODE_HEAD_DIMS`), else the two
        ops (the two ops on decode steps too measured slower: H200 batch 1, 9b4eeb2, qwen3-8b
        211.2 -> 214.6 tok/s fused)."""
        t = qkv.shape[0]
        self._check_cache("rope_cache_attention", qkv, k_cache)
        # batch-invariant mode: always the two ops. The fused kernel folds the newest key in
        # after the others (not in its round) and was taken for decode steps of <= 8 tokens
        # only, so a row rounded differently alone and in a larger step.
        # Long caches take the tensor-core decode kernel, which has no rope prologue.
        mma = self._use_mma_decode(qkv, k_cache, num_heads, num_kv_heads, head_dim,
                                   block_tables.shape[1] * k_cache.shape[1], t)
        if mma or self.ctx.policy.batch_invariant or nvfp4.is_nvfp4(k_cache) or not (
                0 < t <= ROPE_DECODE_MAX_TOKENS and t == seq_lens.shape[0]
                and head_dim in ROPE_DECODE_HEAD_DIMS):
            return compose_rope_cache_attention(
                self.ctx.ops, qkv, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
                block_tables, seq_lens, cu_seqlens_q, scale, kv_scale, num_heads=num_heads,
                num_kv_heads=num_kv_heads, head_dim=head_dim, q_norm=q_norm, k_norm=k_norm,
                eps=eps, rotary_dim=rotary_dim, is_neox=is_neox)
        h, kh, d = num_heads, num_kv_heads, head_dim
        norm_dtype = q_norm.dtype if q_norm is not None else qkv.dtype
        if norm_dtype not in (qkv.dtype, np.float32):
            raise TypeError(f"rope_cache_attention: q/k norm weights in {norm_dtype}; use "
                            f"{qkv.dtype} or float32")
        block_size, max_blocks = k_cache.shape[1], block_tables.shape[1]
        hb, splits = self._decode_plan(t, h, kh, d, max_blocks * block_size)
        out = self.ctx.out((t, h, d), qkv.dtype)
        part_acc, part_ml = self._dec_partials(t, h, d, splits)
        var = variant_of(qkv.dtype)
        name = f"rope_attn_dec{cache_suffix(k_cache, qkv)}_{var}_d{d}_h{hb}"
        kern = self.ctx.kernels.kernel("attention_rope_decode", var, name)
        self.ctx.launch(kern, (t, kh * (h // kh // hb), splits), 128, out, part_acc, part_ml,
                        self.ctx.sync_counters(), qkv, k_cache, v_cache, block_tables, seq_lens,
                        cu_seqlens_q, h, kh, block_size, max_blocks, t, splits,
                        float(scale * LOG2E), float(kv_scale), positions, cos_sin_cache,
                        slot_mapping, q_norm, k_norm, int(norm_dtype != qkv.dtype),
                        int(rotary_dim or d), int(is_neox), float(eps), pdl=self.ctx.pdl)
        return out

    def _attention(self, q, k, v, block_tables, seq_lens, cu_seqlens, num_seqs, num_kv_heads,
                   block_size, max_ctx, scale, kv_scale, causal=True) -> DeviceArray:
        t, h, d = q.shape
        if nvfp4.is_nvfp4(k) and block_tables is not None and self._use_flash(q, q, num_seqs):
            # prefill over an nvfp4 history: the flash kernel on a dense copy of its blocks
            need = nvfp4.gather_bytes(num_seqs, block_tables.shape[1], block_size, num_kv_heads,
                                      d, q.dtype) + 4 * block_tables.size
            scratch = self._nvfp4_scratch.get(self.ctx, need)
            if scratch is not None:
                k, v, block_tables = nvfp4.gather(self.ctx, scratch, k, v, block_tables,
                                                  seq_lens, d, q.dtype)
        flash = self._use_flash(q, k, num_seqs)
        if d not in HEAD_DIMS and not flash:
            raise ValueError(f"attention: head_dim {d} unsupported on cuda (use one of "
                             f"{HEAD_DIMS}, or {FLASH_HEAD_DIMS} in bfloat16/float16)")
        out = self.ctx.out(q.shape, q.dtype)
        if not t:
            return out
        if flash:
            self._flash(out, q, k, v, block_tables, seq_lens, cu_seqlens, num_seqs, num_kv_heads,
                        block_size, scale, causal)
            return out
        # no batch-1 limit: that is the fused-rope kernel's (rope_cache_attention); against the
        # CUDA-core split kernel alone the tensor-core one wins from 512 keys (H200 per op,
        # qwen3-8b heads batch 1: 1,024 keys 7.76 against 10.98 us; 48/8 heads 9.22 / 9.31)
        if causal and block_tables is not None and self._use_mma_decode(
                q, k, h, num_kv_heads, d, max_ctx, t, b1_limit=False):
            self._mma_decode(out, q, k, v, block_tables, seq_lens, cu_seqlens, num_seqs,
                             num_kv_heads, block_size, max_ctx, scale, kv_scale)
            return out
        var = variant_of(q.dtype)
        fp8 = cache_suffix(k, q)
        if fp8 == "_fp8" and d not in FP8_HEAD_DIMS:
            raise ValueError(f"attention: a float8_e4m3fn KV cache needs head_dim in "
                             f"{FP8_HEAD_DIMS} on cuda (got {d})")
        if fp8 == "_nvfp4":
            nvfp4.check_row("attention", k, d)
            if d not in NVFP4_HEAD_DIMS:
                raise ValueError(f"attention: an nvfp4 KV cache needs head_dim in "
                                 f"{NVFP4_HEAD_DIMS} on cuda (got {d})")
        module, name = (("attention_decode", f"attn_dec{fp8}_{var}_d{d}_h{{hb}}") if causal else
                        ("attention_bidir", f"attn_bidir_{var}_d{d}_h{{hb}}"))
        self._split_decode(module, name, out, q, k, v, block_tables, seq_lens, cu_seqlens,
                           num_seqs, num_kv_heads, block_size, max_ctx, scale, kv_scale)
        return out

    def _split_decode(self, module: str, name: str, out, q, k, v, block_tables, seq_lens,
                      cu_seqlens, num_seqs, num_kv_heads, block_size, max_ctx, scale, kv_scale,
                      *extra) -> None:
        """Launch a split decode kernel of attention_decode.cuh (``name`` with ``{hb}``, the
        heads a block, from :meth:`_decode_plan`): grid (token, KV head x head chunk, split),
        partials and the completion counters of the in-kernel combine; ``extra`` after the
        common arguments (the window of ``attn_dec_swa_*``)."""
        t, h, d = q.shape
        hb, splits = self._decode_plan(t, h, num_kv_heads, d, max_ctx)
        part_acc, part_ml = self._dec_partials(t, h, d, splits)
        kern = self.ctx.kernels.kernel(module, variant_of(q.dtype), name.format(hb=hb))
        max_blocks = block_tables.shape[1] if block_tables is not None else 0
        self.ctx.launch(kern, (t, num_kv_heads * (h // num_kv_heads // hb), splits), 128, out,
                        part_acc, part_ml, self.ctx.sync_counters(), q, k, v, block_tables,
                        seq_lens, cu_seqlens, h, num_kv_heads, block_size, max_blocks, num_seqs,
                        splits, float(scale * LOG2E), float(kv_scale), *extra, pdl=self.ctx.pdl)

    def _use_mma_decode(self, q: DeviceArray, k_cache: DeviceArray, h: int, kh: int, d: int,
                        max_ctx: int, t: int = 2, b1_limit: bool = True) -> bool:
        """The tensor-core decode kernel (attention_decode_mma.cu): policy ``decode_plan`` ``mma``,
        or ``auto`` with more than :data:`MMA_DECODE_MIN_CTX` tokens of cache a sequence (more than
        :data:`MMA_DECODE_B1_MAX_CTX` for a single query token ``t`` where ``b1_limit``: the
        fused-rope CUDA-core kernel it stands against there; past
        :data:`MMA_DECODE_B1_MAX_CTX_ODD` for odd groups, of which it takes 1-2 heads a block),
        for a bf16/f16 cache in the activation dtype, a head dim of :data:`MMA_DECODE_STAGES`
        and GQA groups of 2 / 4 / 8 / 16 query heads (3, 5, 6, 7 too at head dim 128; or
        multiples of 16), where its K/V ring fits a block
        (:meth:`OpContext.fits_smem`: on a GB10's 99 KB only head dim 64; the CUDA-core split
        kernels serve the others there). Never in batch-invariant mode (``attention=simt``): it
        splits the context as the step's plan says."""
        policy = self.ctx.policy
        if policy.attention == "simt" or policy.decode_plan not in ("auto", "mma"):
            return False
        b1_max = (MMA_DECODE_B1_MAX_CTX_ODD if mma_decode_heads(h, kh, d) in MMA_DECODE_ODD_HEADS
                  else MMA_DECODE_B1_MAX_CTX)
        if policy.decode_plan == "auto" and (max_ctx <= MMA_DECODE_MIN_CTX or (
                b1_limit and t == 1 and max_ctx <= b1_max)):
            return False
        return (q.dtype.name in ("bfloat16", "float16") and k_cache.dtype == q.dtype
                and d in MMA_DECODE_STAGES and mma_decode_heads(h, kh, d) > 0
                and self.ctx.fits_smem(mma_decode_smem(d, q.dtype.itemsize), MMA_DECODE_STATIC))

    def _mma_decode(self, out, q, k, v, block_tables, seq_lens, cu_seqlens, num_seqs,
                    num_kv_heads, block_size, max_ctx, scale, kv_scale, window: int = 0) -> None:
        """``attn_dec_mma_*`` over each query's last ``window`` keys (all of them with 0);
        ``max_ctx`` the most keys a query reads (the plan's split count)."""
        t, h, d = q.shape
        merge = self.ctx.policy.decode_merge == "kernel"
        hb, splits = (mma_merge_plan if merge else mma_decode_plan)(
            t, h, num_kv_heads, d, max_ctx, self.ctx.num_sms)
        merge = merge and splits > 1
        part_acc, part_ml = self._dec_partials(t, h, d, splits)
        var = variant_of(q.dtype)
        shmem = mma_decode_smem(d, q.dtype.itemsize)
        kern = self.ctx.kernels.kernel("attention_decode_mma", var,
                                       f"attn_dec_mma_{var}_d{d}_h{hb}{'_x' if merge else ''}",
                                       shmem)
        self.ctx.launch(kern, (t, num_kv_heads * (h // num_kv_heads // hb), splits), 128, out,
                        part_acc, part_ml, self.ctx.sync_counters(), q, k, v, block_tables,
                        seq_lens, cu_seqlens, h, num_kv_heads, block_size,
                        block_tables.shape[1], num_seqs, splits, float(scale * LOG2E),
                        float(kv_scale), int(window), shmem=shmem, pdl=self.ctx.pdl)
        if merge:  # each (token, head)'s partials, after the split kernel
            kern = self.ctx.kernels.kernel("attention_decode_mma", var,
                                           f"attn_dec_merge_{var}_d{d}")
            self.ctx.launch(kern, (t, h), d // 4, out, part_acc, part_ml, seq_lens, cu_seqlens,
                            h, num_seqs, splits, int(window), float(kv_scale), pdl=self.ctx.pdl)

    def _dec_partials(self, t: int, h: int, d: int, splits: int):
        """The split partials of the decode kernel (accumulators, (max, sum) pairs), or Nones."""
        if splits < 2:
            return None, None
        return (self.ctx.out((t * h * splits * d,), np.float32),
                self.ctx.out((t * h * splits * 2,), np.float32))

    def _decode_plan(self, t: int, h: int, kh: int, d: int, max_ctx: int) -> tuple[int, int]:
        """``(heads per block, splits)`` of the decode kernel: :func:`shared_decode_plan` or
        :func:`decode_plan` by the policy's ``decode_plan`` (``auto``: shared above
        :data:`LONG_DECODE_CTX` tokens of cache a sequence); batch-invariant mode:
        :func:`batch_invariant_decode_plan` (one split, whatever the step)."""
        if self.ctx.policy.batch_invariant:
            return batch_invariant_decode_plan(h, kh)
        choice = self.ctx.policy.decode_plan
        if choice in ("auto", "mma"):  # mma here: a cache the tensor-core kernel does not take
            choice = "shared" if max_ctx > LONG_DECODE_CTX else "split"
        plan = shared_decode_plan if choice == "shared" else decode_plan
        return plan(t, h, kh, d, max_ctx, self.ctx.num_sms)

    def _use_flash(self, q: DeviceArray, k: DeviceArray, num_seqs: int) -> bool:
        """Tensor-core kernel for multi-token batches (>= 4 query tokens per sequence on
        average) in bf16/f16 with a head dim of :data:`FLASH_HEAD_DIMS`; decode batches keep
        the split-K kernel. Always where the split-K kernel lacks the head dim (80). Policy
        ``attention=simt`` (set by batch-invariant mode) keeps every row on the split-K
        kernel."""
        t, _, d = q.shape
        if not (q.dtype.name in ("bfloat16", "float16") and k.dtype == q.dtype
                and d in FLASH_HEAD_DIMS):
            return False
        return d not in HEAD_DIMS or (t >= 4 * max(num_seqs, 1)
                                      and self.ctx.policy.attention != "simt")

    def _flash(self, out, q, k, v, block_tables, seq_lens, cu_seqlens, num_seqs, num_kv_heads,
               block_size, scale, causal) -> None:
        t, h, d = q.shape
        var = variant_of(q.dtype)
        shmem = (FLASH_BM + 4 * FLASH_BN) * (d + 8) * q.dtype.itemsize
        name = f"flash_{var}_d{d}" if causal else f"flash_bidir_{var}_d{d}"
        kern = self.ctx.kernels.kernel("flash_attention", var, name, shmem)
        max_blocks = block_tables.shape[1] if block_tables is not None else 0
        self.ctx.launch(kern, (-(-t // FLASH_BM) + num_seqs, h), 128, out, q, k, v, block_tables,
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

    def window_decode(self, q: DeviceArray, k_cache: DeviceArray, v_cache: DeviceArray,
                      block_tables: DeviceArray, seq_lens: DeviceArray,
                      cu_seqlens_q: DeviceArray, scale: float, window: int) -> DeviceArray | None:
        """Split decode attention over each query's last ``window`` keys (all of them with 0),
        from the window's first key on, so blocks before it are never read: the tensor-core
        kernel (``attn_dec_mma_*``) where :meth:`_use_mma_decode` takes it for the keys a query
        reads (``min(window, cache width)``; no batch-1 limit, there being no fused-rope kernel
        to beat here), else ``attn_dec_swa_*``, the CUDA-core paged decode kernel (in-kernel
        split combine, block-table entries a round ahead). For plugin ops with sliding-window
        layers (Gemma-2/3/4), at decode and short chunks: None where it does not apply (head
        dim outside :data:`SWA_HEAD_DIMS` and not a tensor-core one (512: Gemma-4's full
        layers, past :data:`MMA_DECODE_MIN_CTX` keys), a cache not in the activation dtype), so
        the caller keeps its own kernel there."""
        t, _, d = q.shape
        _, block_size, kh, _ = k_cache.shape
        if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
            return None
        window = int(window) if window and window > 0 else 0
        max_ctx = block_tables.shape[1] * block_size
        max_ctx = min(max_ctx, window) if window else max_ctx
        mma = self._use_mma_decode(q, k_cache, q.shape[1], kh, d, max_ctx, t, b1_limit=False)
        if not mma and d not in SWA_HEAD_DIMS:
            return None
        out = self.ctx.out(q.shape, q.dtype)
        if not t or not seq_lens.shape[0]:
            return out
        if mma:
            self._mma_decode(out, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
                             seq_lens.shape[0], kh, block_size, max_ctx, scale, 1.0, window)
            return out
        var = variant_of(q.dtype)
        self._split_decode("attention_decode", f"attn_dec_swa_{var}_d{d}_h{{hb}}", out, q,
                           k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
                           seq_lens.shape[0], kh, block_size, max_ctx, scale, 1.0, window)
        return out

    def prefill_attention(self, q: DeviceArray, k: DeviceArray, v: DeviceArray,
                          cu_seqlens: DeviceArray, scale: float, *,
                          causal: bool = True) -> DeviceArray:
        """The flash kernel (``flash_bidir_*`` with ``causal=False``) where it applies, else the
        split-K kernel (``attn_bidir_*`` of ``attention_bidir.cu`` with ``causal=False``)."""
        return self._attention(q, k, v, None, None, cu_seqlens, cu_seqlens.shape[0] - 1,
                               k.shape[1], 1, max(q.shape[0], 1), scale, 1.0, causal)
