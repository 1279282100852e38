"""Attention-side ops of the cuda backend: rotary, KV-cache writes, paged and prefill attention."""

from __future__ import annotations

import numpy as np

from atlas_core.api import float8_e4m3fn
from atlas_core.api import compose_rope_cache_attention
from atlas_cuda.array import DeviceArray
from atlas_cuda.context import COUNTERS, OpContext
from atlas_cuda.kernels_loader import variant_of

LOG2E = 1.4426950408889634
HEAD_DIMS = (16, 32, 64, 128, 256)
FP8_HEAD_DIMS = (64, 128, 256)
#: Head dims of the tensor-core kernel (80: vision towers' 72 padded to a multiple of 16).
FLASH_HEAD_DIMS = (64, 80, 128)
#: Head dims of the fused rope + decode attention kernel (at 256 its per-block prologue cost
#: more than the saved launch from 4K context on, H200), and the most decode tokens it takes.
ROPE_DECODE_HEAD_DIMS = (64, 128)
ROPE_DECODE_MAX_TOKENS = 8
FLASH_BM = FLASH_BN = 64
#: Most floats of split partials the last block of the decode kernel merges (caps the splits:
#: 16 at head_dim 128 with 4 heads a block). 16384 before: H200 batch 1, fewer splits of more
#: rounds each, qwen3-8b at 4,096 tokens of context 233.5 -> 238.5 tok/s, qwen3-30b-a3b at 512
#: 394.7 -> 413.0, qwen3.5-35b-a3b 437.4 -> 439.3; at 128 tokens unchanged. Not measured beyond
#: 4K of context, where fewer blocks may read the cache more slowly.
COMBINE_FLOATS = 8192
#: Resident decode-attention blocks per SM (128 threads, ~210 registers).
BLOCKS_PER_SM = 2
#: Most floats of split partials under the ``shared`` plan (long contexts: more splits of the
#: blocks that hold every head of a KV head).
COMBINE_FLOATS_SHARED = 32768
#: Cache length (tokens a sequence, the block table's width) above which ``auto`` takes the
#: shared plan. H200, batch 1 / 4 / 8 step ms, split -> shared (session 13): qwen3-8b at 32,768
#: tokens 12.09 -> 6.50 / 26.70 -> 13.91 / -, at 8,192 6.11 -> 4.85 / 10.41 -> 7.28 / 15.99 ->
#: 9.69; qwen3-30b-a3b at 8,192 4.95 -> 3.31 / - / 24.43 -> 15.98; at 512 tokens the split plan
#: keeps batch 1 (8b 4.23 against 4.26, 30b 2.52 against 2.60, 0.6b 0.78 against 0.83 ms).
LONG_DECODE_CTX = 4096
#: Head dims of the tensor-core decode kernel (attention_decode_mma.cu) and the stages of its
#: K/V ring (kept in step with the kernel's DecMma::NST): two blocks an SM up to 128, one at 256.
MMA_DECODE_STAGES = {64: 4, 128: 3, 256: 2}
#: Cache length (the block table's width) above which ``auto`` takes that kernel: H200,
#: per op (scripts/attn_decode_bench.py), mma against the CUDA-core plans, qwen3-8b heads, us:
#: batch 1 at 512 tokens 7.20 / 7.54, 1,024 7.76 / 10.98, 4,096 11.65 / 30.85; batch 8 at
#: 1,024 15.75 / 52.22; batch 1 at 128 tokens the split plan keeps it (5.26 against 6.69).
MMA_DECODE_MIN_CTX = 512
#: One query token (batch 1): the CUDA-core kernel with its fused rope prologue keeps caches up
#: to this long. H200, qwen3-8b step ms, auto (mma) against decode_plan=shared, one call: batch 1
#: at 1,024 tokens 4.79 / 4.42, at 8,192 5.13 / 4.88; batch 8 at 1,024 5.82 / 5.89, at 8,192
#: 8.04 / 9.73; at 32,768 the mma kernel is 27 us a layer faster per op (41.7 against 69.1 us).
#: Where between 8k and 32k batch 1 crosses over is not measured: 16,384 is a guess.
MMA_DECODE_B1_MAX_CTX = 16384
#: Keys of one K/V tile of that kernel (16 a warp).
MMA_DECODE_BN = 64
#: Most partial floats (heads x head dim x splits) a block row of that kernel merges: more than
#: the CUDA-core kernels' cap, so few KV heads still fill the GPU (qwen3.5-35b-a3b, 2 KV heads
#: of 8 query heads at 256, batch 1: 64 splits instead of 16; H200 at 32,768 tokens the capped
#: plan ran at 507 GB/s).
COMBINE_FLOATS_MMA = 131072


def mma_decode_heads(h: int, kh: int) -> int:
    """Query heads a block of the tensor-core decode kernel takes (the rows of its 16-row mma
    tile: the whole GQA group up to 16, else 16 at a time), or 0 where it does not apply
    (one query head per KV head: nothing to share)."""
    group = h // kh
    hb = min(group, 16)
    return hb if hb in (2, 4, 8, 16) and group % hb == 0 else 0


def mma_decode_smem(d: int, itemsize: int) -> int:
    """Dynamic shared memory of the tensor-core decode kernel: 16 query rows and the K/V ring,
    rows padded by 8 elements (ldmatrix without bank conflicts)."""
    return (16 + MMA_DECODE_STAGES[d] * 2 * MMA_DECODE_BN) * (d + 8) * itemsize


def mma_decode_plan(t: int, h: int, kh: int, d: int, max_ctx: int,
                    num_sms: int) -> tuple[int, int]:
    """``(heads per block, splits)`` of the tensor-core decode kernel: a wave of blocks (two an
    SM up to head dim 128, one at 256), each split at least one 64-key tile, the partials within
    :data:`COMBINE_FLOATS_MMA`."""
    hb = mma_decode_heads(h, kh)
    target = (2 if d <= 128 else 1) * num_sms
    base = t * kh * (h // kh // hb)
    if base > COUNTERS:
        return hb, 1
    return hb, max(1, min(target // base, COMBINE_FLOATS_MMA // (hb * d),
                          -(-max_ctx // MMA_DECODE_BN)))


def shared_decode_plan(t: int, h: int, kh: int, d: int, max_ctx: int,
                       num_sms: int) -> tuple[int, int]:
    """``(heads per block, splits)`` that read each KV head's cache once: every query head of a
    GQA group (up to 4) in one block, the context split across enough blocks for a wave."""
    group, target = h // kh, BLOCKS_PER_SM * num_sms
    per_round = {16: 256, 32: 128, 64: 64, 128: 32, 256: 16}[d]
    hb = next(x for x in (4, 2, 1) if group % x == 0)
    base = t * kh * (group // hb)
    if base > COUNTERS:
        return hb, 1
    return hb, max(1, min(target // base, COMBINE_FLOATS_SHARED // (hb * d),
                          -(-max_ctx // per_round)))


def decode_plan(t: int, h: int, kh: int, d: int, max_ctx: int, num_sms: int) -> tuple[int, int]:
    """``(heads per block, splits)`` of split decode attention: one wave of blocks (two per SM),
    each split at least one round of keys, the in-kernel combine's partials (splits x heads x d
    floats) within ``COMBINE_FLOATS``. Fewer heads per block where that gains a quarter more
    blocks, or as many blocks with fewer splits: a shorter merge beats sharing K/V loads among
    a block's heads while the cache is small (H200 batch 1, one head and 8 splits against two
    heads and 16: qwen3-30b-a3b 411.5 -> 415.6 tok/s at 512 tokens of context, 412.0 -> 417.0 at
    128; qwen3-8b 238.8 -> 239.8 at 4,096; qwen3-0.6b 1,211.9 -> 1,254.2 at 1,024). Batches
    that fill the wave with tokens keep four heads a block and one split."""
    group, target = h // kh, BLOCKS_PER_SM * num_sms
    per_round = {16: 256, 32: 128, 64: 64, 128: 32, 256: 16}[d]
    best = (0, 1, 1)
    for hb in (4, 2, 1):
        if group % hb:
            continue
        base = t * kh * (group // hb)
        splits = max(1, min(target // base, COMBINE_FLOATS // (hb * d),
                            -(-max_ctx // per_round)))
        if base > COUNTERS:
            splits = 1
        score = min(base * splits, target)
        if score > 1.25 * best[0] or (score >= best[0] and splits < best[2]):
            best = (score, hb, splits)
    return best[1], best[2]


def batch_invariant_decode_plan(h: int, kh: int) -> tuple[int, int]:
    """``(heads per block, splits)`` of batch-invariant mode: the most heads of a GQA group a
    block takes (up to 4, a function of the model) and ONE split, whatever the step.

    Why one: the decode kernel cuts a row's ``len`` keys into spans of
    ``ceil(len / num_splits)`` rounded up to a round of keys, and ``num_splits`` is the
    launch's, shared by every row; so a row's online-softmax order, and its bits, depend on the
    split count, which the other plans pick from the step's tokens, longest cache and SM count.
    The count must therefore be a constant, and 1 is the only one every launch can take: more
    splits need ``tokens x head blocks <= COUNTERS`` completion counters and ``tokens x heads x
    splits x head_dim`` floats of partials, which a prefill chunk of a few hundred tokens
    already exceeds. With one split each row is one block over its keys in order, the same
    for a decode row and for the same position as a prefill row."""
    group = h // kh
    return next(x for x in (4, 2, 1) if group % x == 0), 1


class AttentionOps:
    """Rotary embedding, KV-cache writes, decode (split) and prefill (flash) attention.

    Args:
        ctx: the backend's :class:`~atlas_cuda.context.OpContext`.
    """

    def __init__(self, ctx: OpContext) -> None:
        self.ctx = ctx

    def _rope(self, q_out, k_out, v_out, q, k, v, strides, positions, cos_sin_cache, slots,
              q_norm, k_norm, heads, eps, rotary_dim, is_neox, kv_scale) -> None:
        num_heads, num_kv_heads, head_dim = heads
        t = positions.shape[0]
        if not t:
            return
        rows = num_heads + (2 if v is not None else 1) * num_kv_heads
        warps = min(4, rows)
        groups = -(-rows // warps)
        norm_dtype = q_norm.dtype if q_norm is not None else q.dtype
        if norm_dtype not in (q.dtype, np.float32):
            raise TypeError(f"qk_norm_rope_and_cache: q/k norm weights in {norm_dtype}; use "
                            f"{q.dtype} or float32")
        name = "rope_qkv" + _cache_suffix(k_out, q) + ("" if norm_dtype == q.dtype else "_nf32")
        kern = self.ctx.kernel("rope_cache", q.dtype, name)
        self.ctx.launch(kern, (t, groups), 32 * warps, q_out, k_out, v_out, q, k, v,
                        *(np.int64(s) for s in strides), positions, cos_sin_cache, slots, q_norm,
                        k_norm, num_heads, num_kv_heads, head_dim, int(rotary_dim or head_dim),
                        int(is_neox), float(eps), float(1.0 / kv_scale), shmem=warps * head_dim * 4,
                        pdl=self.ctx.pdl)

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
            self.ctx.launch(self.ctx.kernel("rope_cache", k.dtype, name), t, 128, k_cache,
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
        q_out = self.ctx.out((t, num_heads, head_dim), qkv.dtype)
        item = qkv.dtype.itemsize
        k = DeviceArray(qkv.ptr + num_heads * head_dim * item, (t,), qkv.dtype, qkv.owner)
        v = DeviceArray(k.ptr + num_kv_heads * head_dim * item, (t,), qkv.dtype, qkv.owner)
        row = (num_heads + 2 * num_kv_heads) * head_dim
        self._rope(q_out, k_cache, v_cache, qkv, k, v, (row, row, row), positions, cos_sin_cache,
                   slot_mapping, q_norm, k_norm, (num_heads, num_kv_heads, head_dim), eps,
                   rotary_dim, is_neox, kv_scale)
        return q_out

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
        if mma or self.ctx.policy.batch_invariant or not (
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
        name = f"rope_attn_dec{_cache_suffix(k_cache, qkv)}_{var}_d{d}_h{hb}"
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
        if causal and block_tables is not None and self._use_mma_decode(
                q, k, h, num_kv_heads, d, max_ctx, t):
            self._mma_decode(out, q, k, v, block_tables, seq_lens, cu_seqlens, num_seqs,
                             num_kv_heads, block_size, max_ctx, scale, kv_scale)
            return out
        var = variant_of(q.dtype)
        fp8 = _cache_suffix(k, q)
        if fp8 and d not in FP8_HEAD_DIMS:
            raise ValueError(f"attention: a float8_e4m3fn KV cache needs head_dim in "
                             f"{FP8_HEAD_DIMS} on cuda (got {d})")
        max_blocks = block_tables.shape[1] if block_tables is not None else 0
        args = (q, k, v, block_tables, seq_lens, cu_seqlens, h, num_kv_heads, block_size,
                max_blocks, num_seqs)
        hb, splits = self._decode_plan(t, h, num_kv_heads, d, max_ctx)
        part_acc, part_ml = self._dec_partials(t, h, d, splits)
        if causal:
            kern = self.ctx.kernels.kernel("attention_decode", var,
                                           f"attn_dec{fp8}_{var}_d{d}_h{hb}")
        else:
            kern = self.ctx.kernels.kernel("attention_bidir", var, f"attn_bidir_{var}_d{d}_h{hb}")
        self.ctx.launch(kern, (t, num_kv_heads * (h // num_kv_heads // hb), splits), 128, out,
                        part_acc, part_ml, self.ctx.sync_counters(), *args, splits,
                        float(scale * LOG2E), float(kv_scale), pdl=self.ctx.pdl)
        return out

    def _use_mma_decode(self, q: DeviceArray, k_cache: DeviceArray, h: int, kh: int, d: int,
                        max_ctx: int, t: int = 2) -> bool:
        """The tensor-core decode kernel (attention_decode_mma.cu): policy ``decode_plan`` ``mma``,
        or ``auto`` with more than :data:`MMA_DECODE_MIN_CTX` tokens of cache a sequence (more than
        :data:`MMA_DECODE_B1_MAX_CTX` for a single query token ``t``), for a
        bf16/f16 cache in the activation dtype, a head dim of :data:`MMA_DECODE_STAGES` and
        GQA groups of 2-16 query heads (or multiples of 16). Never in batch-invariant mode
        (``attention=simt``): it splits the context as the step's plan says."""
        policy = self.ctx.policy
        if policy.attention == "simt" or policy.decode_plan not in ("auto", "mma"):
            return False
        if policy.decode_plan == "auto" and (
                max_ctx <= MMA_DECODE_MIN_CTX or (t == 1 and max_ctx <= MMA_DECODE_B1_MAX_CTX)):
            return False
        return (q.dtype.name in ("bfloat16", "float16") and k_cache.dtype == q.dtype
                and d in MMA_DECODE_STAGES and mma_decode_heads(h, kh) > 0)

    def _mma_decode(self, out, q, k, v, block_tables, seq_lens, cu_seqlens, num_seqs,
                    num_kv_heads, block_size, max_ctx, scale, kv_scale) -> None:
        t, h, d = q.shape
        hb, splits = mma_decode_plan(t, h, num_kv_heads, d, max_ctx, self.ctx.num_sms)
        part_acc, part_ml = self._dec_partials(t, h, d, splits)
        var = variant_of(q.dtype)
        shmem = mma_decode_smem(d, q.dtype.itemsize)
        kern = self.ctx.kernels.kernel("attention_decode_mma", var,
                                       f"attn_dec_mma_{var}_d{d}_h{hb}", shmem)
        self.ctx.launch(kern, (t, num_kv_heads * (h // num_kv_heads // hb), splits), 128, out,
                        part_acc, part_ml, self.ctx.sync_counters(), q, k, v, block_tables,
                        seq_lens, cu_seqlens, h, num_kv_heads, block_size,
                        block_tables.shape[1], num_seqs, splits, float(scale * LOG2E),
                        float(kv_scale), shmem=shmem, pdl=self.ctx.pdl)

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

    def prefill_attention(self, q: DeviceArray, k: DeviceArray, v: DeviceArray,
                          cu_seqlens: DeviceArray, scale: float, *,
                          causal: bool = True) -> DeviceArray:
        """The flash kernel (``flash_bidir_*`` with ``causal=False``) where it applies, else the
        split-K kernel (``attn_bidir_*`` of ``attention_bidir.cu`` with ``causal=False``)."""
        return self._attention(q, k, v, None, None, cu_seqlens, cu_seqlens.shape[0] - 1,
                               k.shape[1], 1, max(q.shape[0], 1), scale, 1.0, causal)


def _cache_suffix(cache: DeviceArray | None, act: DeviceArray) -> str:
    """``"_fp8"`` for a float8_e4m3fn KV cache (kernel name suffix), else ``""``."""
    return "_fp8" if cache is not None and cache.dtype == float8_e4m3fn and act.dtype != cache.dtype else ""

