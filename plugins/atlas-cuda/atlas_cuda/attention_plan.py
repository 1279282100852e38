"""Plans of the split decode attention kernels (which kernel, heads per block, splits): pure
functions of the step's shapes and the SM count, so a captured graph keeps its plan and the
host tests check them without a GPU. Used by :mod:`atlas_cuda.ops_attention`."""

from __future__ import annotations

from atlas_cuda.context import COUNTERS


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
#: K/V ring (kept in step with the kernel's DecMma::NST and DW_NST): two blocks an SM up to 128,
#: one at 256 and 512.
MMA_DECODE_STAGES = {64: 4, 128: 3, 256: 2, 512: 3}
#: Static shared memory of that kernel at most (ptxas: 1,552 bytes at head dim 512, up to 528
#: below), on top of :func:`mma_decode_smem` when checking it fits a block.
MMA_DECODE_STATIC = 2048
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
#: The same for GQA groups of :data:`MMA_DECODE_ODD_HEADS`, where the CUDA-core kernel takes 1-2
#: heads a block. H200, qwen3-14b (groups of 5) batch 1 step ms, one context a run (tables that
#: wide), session 25: 1,024 tokens mma 8.40 against the CUDA-core split plan 8.02; 4,096 tokens
#: mma 8.91 against shared 9.13. Between the two not measured.
MMA_DECODE_B1_MAX_CTX_ODD = 4096
#: Keys of one K/V tile of that kernel (16 a warp), and at head dim 512 (``DW_BN``: 8 keys a
#: warp score, all 32 every warp multiplies into its quarter of the columns).
MMA_DECODE_BN, MMA_DECODE_BN_512 = 64, 32
#: Most partial floats (heads x head dim x splits) a block row of that kernel merges: more than
#: the CUDA-core kernels' cap, so few KV heads still fill the GPU (qwen3.5-35b-a3b, 2 KV heads
#: of 8 query heads at 256, batch 1: 64 splits instead of 16; H200 at 32,768 tokens the capped
#: plan ran at 507 GB/s).
COMBINE_FLOATS_MMA = 131072


#: GQA groups other than 2 / 4 / 8 / 16 the tensor-core decode kernel takes whole (its tile's
#: rows past the group zero), at head dim 128 only: MiniMax-M2 (6), Qwen3-14B / Qwen2.5-14B and
#: 32B (5), Qwen2.5-7B (7). The CUDA-core kernels take 2 or 1 of such a group's heads a block,
#: so they read the group's cache 3-7 times.
MMA_DECODE_ODD_HEADS = (3, 5, 6, 7)


def mma_decode_heads(h: int, kh: int, d: int = 128) -> int:
    """Query heads a block of the tensor-core decode kernel takes at head dim ``d`` (the rows of
    its 16-row mma tile: the whole GQA group up to 16, else 16 at a time), or 0 where it does
    not apply (one query head per KV head: nothing to share; a group it has no kernel for)."""
    group = h // kh
    if group > 16:
        return 16 if group % 16 == 0 else 0
    if group in (2, 4, 8, 16) or (d == 128 and group in MMA_DECODE_ODD_HEADS):
        return group
    return 0


def mma_decode_bn(d: int) -> int:
    """Keys of one K/V tile of the tensor-core decode kernel at head dim ``d``."""
    return MMA_DECODE_BN_512 if d == 512 else MMA_DECODE_BN


def mma_decode_smem(d: int, itemsize: int) -> int:
    """Dynamic shared memory of the tensor-core decode kernel: 16 query rows and the K/V ring,
    rows padded by 8 elements (ldmatrix without bank conflicts)."""
    return (16 + MMA_DECODE_STAGES[d] * 2 * mma_decode_bn(d)) * (d + 8) * itemsize


def mma_decode_plan(t: int, h: int, kh: int, d: int, max_ctx: int,
                    num_sms: int) -> tuple[int, int]:
    """``(heads per block, splits)`` of the tensor-core decode kernel: a wave of blocks (two an
    SM up to head dim 128, one at 256), each split at least one 64-key tile, the partials within
    :data:`COMBINE_FLOATS_MMA`."""
    hb = mma_decode_heads(h, kh, d)
    if d == 512:
        return _mma_decode_plan_512(t, h, kh, hb, max_ctx, num_sms)
    target = (2 if d <= 128 else 1) * num_sms
    base = t * kh * (h // kh // hb)
    if base > COUNTERS:
        return hb, 1
    return hb, max(1, min(target // base, COMBINE_FLOATS_MMA // (hb * d),
                          -(-max_ctx // MMA_DECODE_BN)))


def _mma_decode_plan_512(t: int, h: int, kh: int, hb: int, max_ctx: int,
                         num_sms: int) -> tuple[int, int]:
    """Head dim 512 (one block an SM): the heads a block (the group's, or a half, quarter ...)
    whose plan :func:`_mma_512_cost` rates fastest, each with the most splits one wave and the
    partials' cap allow."""
    best = None
    while hb >= 2 and (h // kh) % hb == 0:
        base = t * kh * (h // kh // hb)
        if base > COUNTERS:
            break
        splits = mma_512_splits(t, h, kh, hb, max_ctx, num_sms)
        cost = _mma_512_cost(t, h, kh, hb, splits, max_ctx, num_sms)
        if best is None or cost < best[0]:
            best = (cost, hb, splits)
        hb //= 2
    return (best[1], best[2]) if best else (mma_decode_heads(h, kh, 512), 1)


def mma_merge_plan(t: int, h: int, kh: int, d: int, max_ctx: int,
                   num_sms: int) -> tuple[int, int]:
    """``(heads per block, splits)`` of the tensor-core decode kernel whose partials a kernel of
    their own merges (policy ``decode_merge=kernel``: ``attn_dec_merge_*``): the whole GQA group
    a block (up to 16 heads), so each KV head's cache is read once, and the splits of one wave
    (two blocks an SM up to head dim 128, one above), at least one K/V tile each; no cap on the
    partials (no single block merges them)."""
    hb = mma_decode_heads(h, kh, d)
    base = t * kh * (h // kh // hb)
    target = (2 if d <= 128 else 1) * num_sms
    return hb, max(1, min(target // base, -(-max_ctx // mma_decode_bn(d))))


def mma_512_splits(t: int, h: int, kh: int, hb: int, max_ctx: int, num_sms: int) -> int:
    """Splits of the 512-wide decode plan at ``hb`` heads a block: the most one wave (a block an
    SM), the partials' cap (:data:`COMBINE_FLOATS_MMA`) and one 32-key tile a split allow."""
    base = t * kh * (h // kh // hb)
    return max(1, min(num_sms // base, COMBINE_FLOATS_MMA // (hb * 512),
                      -(-max_ctx // MMA_DECODE_BN_512)))


#: The cost model of the 512-wide plan, fitted to H200 per-op times (session 24,
#: ``attn_decode_bench.py --gemma-full``, gemma-4-26b-a4b / 31b heads at batch 1-32, 1k-32k keys,
#: forced 8 / 4 / 2 heads a block; it picks the fastest of the three in all ten cells): us a
#: 32-key tile of one block's span (latency-bound: four warps an SM), us per thousand partial
#: floats the merging block reads, device bytes per us, and the K/V bytes under which a group's
#: blocks re-read them from L2 for free.
MMA512_TILE_US, MMA512_MERGE_US, MMA512_BYTES_PER_US, MMA512_L2_BYTES = 2.27, 0.135, 4.0e6, 32e6


def _mma_512_cost(t: int, h: int, kh: int, hb: int, splits: int, max_ctx: int,
                  num_sms: int) -> float:
    """Estimated microseconds of the 512-wide decode plan: the slower of a block's tiles
    (latency) and the wave's bytes (bandwidth, the K/V read once a block row of the group when
    it exceeds L2, over the share of SMs the blocks fill), plus the last block's merge."""
    blocks = t * kh * (h // kh // hb) * splits
    waves = -(-blocks // num_sms)
    tiles = -(-max_ctx // (splits * MMA_DECODE_BN_512)) * waves
    kv = t * kh * max_ctx * 512 * 4
    reads = kv * (h // kh // hb) if kv > MMA512_L2_BYTES else kv
    filled = blocks / (waves * num_sms)
    latency = tiles * MMA512_TILE_US
    bandwidth = reads / (filled * MMA512_BYTES_PER_US)
    merge = MMA512_MERGE_US * splits * hb * 512 / 1000 if splits > 1 else 0.0
    return max(latency, bandwidth) + merge


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
