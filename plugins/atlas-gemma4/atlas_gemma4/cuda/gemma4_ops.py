"""Gemma-4's ops on the cuda backend (``cuda/kernels/gemma4_elementwise.cu``,
``gemma4_attention.cu`` and ``gemma4_attention_mma.cu`` of this package; ``ffn_in``: the core's
``gemv_norm.cu``), registered as the ``cuda`` implementations by
:mod:`atlas_gemma4.plugin` and bound to the backend's :class:`~atlas_cuda.context.OpContext`.

Same signatures and semantics as :mod:`atlas_gemma4.ops`. Needs atlas-cuda
(``pip install atlas-gemma4[cuda]``); imported only when a cuda backend builds its op table.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from atlas_cuda.array import DeviceArray
from atlas_cuda.ops_attention import AttentionOps
from atlas_cuda.ops_gemv import GemvOps
from atlas_cuda.kernels_loader import variant_of

from atlas_gemma4.ops import compose_ffn_in

LOG2E = 1.4426950408889634
#: Head sizes the attention kernels are built for (Gemma-4: 256 sliding, 512 full).
HEAD_DIMS = (16, 32, 64, 128, 256, 512)
#: (token, head) rows of one tiled prefill block (``SwaTile::R``) and the head chunks it takes.
TILE_ROWS, TILE_HEADS = 16, (8, 4, 2, 1)
#: Most query heads a split block takes (``SWA_SPLIT`` instantiations: 4 only below 512).
SPLIT_HEADS = (4, 2, 1)
#: Keys a split covers at least, and the most splits of one query.
SPLIT_MIN_KEYS, MAX_SPLITS = 64, 32
#: Head sizes, (token, head) rows a block and head chunks of the tensor-core prefill kernel
#: (``swa_mma``: bf16 / f16, sm_80+).
MMA_HEAD_DIMS, MMA_ROWS, MMA_HEADS = (64, 128, 256, 512), 64, (16, 8, 4, 2, 1)
#: Widest row of ``g4_ffn_out`` (1,024 threads of 8 columns).
FFN_OUT_MAX_D = 8192
#: Broadcast modes of ``g4_mul`` (``MUL_*`` in gemma4_elementwise.cu).
MUL_SCALAR, MUL_ROW, MUL_COLUMN, MUL_FULL = 0, 1, 2, 3


#: Decode attention at head sizes 64-256: ``auto`` (the core's windowed paged decode kernel) or
#: ``own`` (this package's ``swa_split``, as at 512).
DECODE_ATTENTION_ENV = "ATLAS_GEMMA_DECODE_ATTENTION"


def _env_choice(name: str, allowed: tuple[str, ...]) -> str:
    """The value of environment variable ``name`` (``allowed[0]`` if unset), one of
    ``allowed``; read when a backend binds these ops."""
    kind = os.environ.get(name, allowed[0])
    if kind not in allowed:
        raise ValueError(f"{name}={kind!r}: use " + " or ".join(repr(a) for a in allowed))
    return kind


def decode_attention() -> str:
    """The decode attention :data:`DECODE_ATTENTION_ENV` selects."""
    return _env_choice(DECODE_ATTENTION_ENV, ("auto", "own"))


#: ``ffn_in`` at decode: ``auto`` (the fused ``gemvn_norm2_act`` kernel where it applies) or
#: ``composed`` (the separate ops, for A/B timing).
FFN_IN_ENV = "ATLAS_GEMMA_FFN_IN"


def ffn_in_mode() -> str:
    """The ``ffn_in`` path :data:`FFN_IN_ENV` selects."""
    return _env_choice(FFN_IN_ENV, ("auto", "composed"))


#: Prefill attention on tensor cores: ``auto`` / ``fa`` (``swa_fa``: K/V streamed through a
#: two-stage cp.async ring, 32 keys a tile, where its shared memory fits a block, else
#: ``swa_mma``) or ``mma`` (``swa_mma``: each tile copied synchronously). H200, per op
#: (scripts/gemma_prefill_bench.py, session 25), a 4k chunk after 0 / 12k / 28k tokens:
#: 26b full layers 9.42 / 61.59 / 130.83 -> 6.80 / 45.53 / 97.11 ms, 31b full 17.81 / 120.56 /
#: 258.91 -> 13.15 / 89.79 / 192.97, sliding layers 2.3-2.4x; 26b's 32k-token TTFT 4.08 ->
#: 3.15 s.
PREFILL_ATTENTION_ENV = "ATLAS_GEMMA_PREFILL_ATTENTION"


def prefill_attention() -> str:
    """The prefill attention :data:`PREFILL_ATTENTION_ENV` selects."""
    return _env_choice(PREFILL_ATTENTION_ENV, ("auto", "fa", "mma"))


def tile_shmem(head_dim: int, itemsize: int = 4) -> int:
    """Dynamic shared memory of ``swa_tile`` at ``head_dim`` (``SwaTile::SMEM``)."""
    keys = 16 if head_dim >= 512 else 32
    padded = head_dim + 1
    return itemsize * (TILE_ROWS * padded + keys * padded + keys * head_dim + TILE_ROWS * keys
                       + 2 * TILE_ROWS)


def mma_shmem(head_dim: int) -> int:
    """Dynamic shared memory of ``swa_mma`` at ``head_dim`` (``SwaMma::SMEM``, 2-byte types)."""
    keys, cols = (16 if head_dim >= 512 else 32), min(head_dim, 256)
    return 2 * (MMA_ROWS * (head_dim + 8) + keys * (head_dim + 8) + cols * (keys + 8))


def fa_shmem(head_dim: int) -> int:
    """Dynamic shared memory of ``swa_fa`` at ``head_dim`` (``SwaFa::SMEM``, 2-byte types): the
    query rows, then two stages of 32 keys' K rows and V column halves."""
    cols = min(head_dim, 256)
    return 2 * (MMA_ROWS * (head_dim + 8) + 2 * 32 * (head_dim + 8) + 2 * 32 * (cols + 8))


def mul_mode(a_shape: tuple, b_shape: tuple) -> int:
    """How ``b`` broadcasts against ``a`` in ``g4_mul``; ValueError for other shapes."""
    a_size, b_size = int(np.prod(a_shape)), int(np.prod(b_shape))
    d = a_shape[-1] if a_shape else 1
    if b_size == 1:
        return MUL_SCALAR
    if tuple(b_shape) == tuple(a_shape):
        return MUL_FULL
    if b_shape[-1] == d and b_size == d:
        return MUL_ROW
    if b_shape[-1] == 1 and b_size * d == a_size:
        return MUL_COLUMN
    raise ValueError(f"mul: operand of shape {tuple(b_shape)} does not broadcast against "
                     f"{tuple(a_shape)} on cuda; use a scalar, [d], [..., 1] or the same shape")


def split_plan(num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int,
               max_keys: int, num_sms: int) -> tuple[int, int]:
    """``(query heads a block, splits)`` of ``swa_split``: about two blocks per SM, each split
    at least :data:`SPLIT_MIN_KEYS` keys of the longest span a query may see."""
    group = num_heads // num_kv_heads
    hb = next(h for h in SPLIT_HEADS if group % h == 0 and (h <= 2 or head_dim < 512))
    blocks = max(1, num_tokens * num_kv_heads * (group // hb))
    splits = min(MAX_SPLITS, (2 * num_sms) // blocks, -(-max_keys // SPLIT_MIN_KEYS))
    return hb, max(1, splits)


class Gemma4CudaOps:
    """The Gemma-4 op implementations of one cuda backend.

    Args:
        ctx: the backend's :class:`~atlas_cuda.context.OpContext`.
    """

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.decode_attention = decode_attention()
        self.ffn_in_mode = ffn_in_mode()
        self.prefill_attention = prefill_attention()

    def _grid(self, n: int) -> int:
        return max(1, min(-(-n // 256), 8 * self.ctx.num_sms))

    def mul(self, a: DeviceArray, b: DeviceArray) -> DeviceArray:
        mode = mul_mode(a.shape, b.shape)
        out = self.ctx.out(a.shape, a.dtype)
        if a.size:
            if b.dtype == a.dtype:
                kernel = self.ctx.kernel("gemma4_elementwise", a.dtype, "g4_mul")
            else:
                b = self.ctx.f32(b)
                kernel = self.ctx.kernel("gemma4_elementwise", a.dtype, "g4_mul_wf32")
            self.ctx.launch(kernel, self._grid(a.size), 256, out, a, b, mode,
                            int(a.shape[-1]) if a.shape else 1, np.int64(a.size),
                            pdl=self.ctx.pdl)
        return out

    def softcap(self, x: DeviceArray, cap: float) -> DeviceArray:
        if not cap > 0:
            raise ValueError(f"softcap: the cap must be positive, got {cap}")
        out = self.ctx.out(x.shape, x.dtype)
        if x.size:
            self.ctx.launch(self.ctx.kernel("gemma4_elementwise", x.dtype, "g4_softcap"),
                            self._grid(x.size), 256, out, x, float(cap), np.int64(x.size),
                            pdl=self.ctx.pdl)
        return out

    def mul_gathered(self, a: DeviceArray, ids: DeviceArray, table: DeviceArray) -> DeviceArray:
        if a.dtype != np.float32 or ids.dtype != np.int32 or ids.size != a.size:
            raise TypeError(f"mul_gathered: float32 weights and int32 ids of the same size on "
                            f"cuda, got {a.dtype} {a.shape} and {ids.dtype} {ids.shape}")
        out = self.ctx.out(a.shape, np.float32)
        if a.size:
            self.ctx.launch(self.ctx.kernel("gemma4_elementwise", table.dtype, "g4_mul_gathered"),
                            self._grid(a.size), 256, out, a, ids, table, np.int64(a.size),
                            pdl=self.ctx.pdl)
        return out

    def ffn_in(self, attn: DeviceArray, hidden: DeviceArray, attn_weight: DeviceArray,
               pre_weight: DeviceArray, experts_weight: DeviceArray | None, eps: float,
               gate_up: Any, bias: DeviceArray | None = None, zero_centered: bool = False,
               activation: str | None = "gelu_tanh"):
        """Up to the policy's ``gemv_rows`` rows (1 by default; K <= 8,192, a plain gate/up
        weight in the activations' dtype, 16-byte aligned; float32 one row): one kernel,
        ``gemv_norm.cu``'s ``gemvn_norm2_act`` (:meth:`GemvOps.norm2_gemv`), whose every block
        normalises the attention output and the residual sum itself, block 0 writing the
        residual stream and the experts' input. It replaces the post-attention ``rms_norm``,
        the fused ``rms_norm_linear`` and the experts' ``rms_norm``: two launches fewer a block
        (60 of the 63 ``rms_norm`` launches, 3.8 us each, of a gemma-4-26b-a4b decode step at
        batch 1; one fewer a dense or Gemma-3 block). H200, ``atlas bench`` at 1,024 tokens,
        same call (session 23): 3.30 ms a step with the separate ops, 3.11 with this kernel
        (56.2 -> 59.7% of the floor). Otherwise (more rows, a quantized ``gate_up``..., or
        ``ATLAS_GEMMA_FFN_IN=composed``) the separate ops
        (:func:`~atlas_gemma4.ops.compose_ffn_in`)."""
        gemv = self.ctx.bind(GemvOps)
        if self.ffn_in_mode == "auto" and gemv.norm2_gemv_fusable(
                attn, hidden, attn_weight, pre_weight, experts_weight, gate_up, bias, activation):
            return gemv.norm2_gemv(attn, hidden, attn_weight, pre_weight, experts_weight, eps,
                                   gate_up, bias, zero_centered, activation)
        return compose_ffn_in(self.ctx.ops, attn, hidden, attn_weight, pre_weight,
                              experts_weight, eps, gate_up, bias, zero_centered, activation)

    def ffn_out(self, hidden: DeviceArray, ffn: DeviceArray, ffn_weight: DeviceArray | None,
                routed: DeviceArray | None, routed_weight: DeviceArray | None,
                post_weight: DeviceArray, scalar: DeviceArray | None, eps: float,
                zero_centered: bool = False) -> DeviceArray:
        """One kernel (``g4_ffn_out``): a block per row, up to :data:`FFN_OUT_MAX_D` columns;
        six launches of the separate ops (three norms, two adds, the scalar) at a MoE block."""
        d = hidden.shape[-1]
        if d % 8 or d > FFN_OUT_MAX_D:
            raise ValueError(f"ffn_out: hidden size {d} on cuda must be a multiple of 8 up to "
                             f"{FFN_OUT_MAX_D}")
        if (routed is None) != (ffn_weight is None) or (routed is None) != (routed_weight is None):
            raise ValueError("ffn_out: pass routed, ffn_weight and routed_weight together")
        out = self.ctx.out(hidden.shape, hidden.dtype)
        rows = hidden.size // d if d else 0
        if rows:
            threads = min(1024, max(32, -(-(d // 8) // 32) * 32))
            self.ctx.launch(self.ctx.kernel("gemma4_elementwise", hidden.dtype, "g4_ffn_out"),
                            rows, threads, out, hidden, ffn, ffn_weight, routed, routed_weight,
                            post_weight, scalar, float(eps), d, int(zero_centered),
                            pdl=self.ctx.pdl)
        return out

    def sliding_window_attention(self, q: DeviceArray, k_cache: DeviceArray,
                                 v_cache: DeviceArray, block_tables: DeviceArray,
                                 seq_lens: DeviceArray, cu_seqlens_q: DeviceArray, scale: float,
                                 window: int, kv_scale: float = 1.0) -> DeviceArray:
        """Prefill-heavy steps (at least 4 query tokens a sequence on average): ``swa_mma``
        (tensor cores) in bf16 / f16 at head sizes 64-512 on sm_80+ unless policy
        ``attention=simt``, else ``swa_tile``; decode steps: the core's ``window_decode`` where it
        applies (its tensor-core ``attn_dec_mma_*`` past 512 keys in bf16 / f16 at head sizes
        64-512, else ``attn_dec_swa_*`` at 64 / 128 / 256), else (512 over at most 512 keys or
        in float32, the other sizes, or ``ATLAS_GEMMA_DECODE_ATTENTION=own``) ``swa_split``
        (several splits merged in-kernel by the last block)."""
        t, h, d = q.shape
        num_seqs = seq_lens.shape[0]
        self._check(q, k_cache, v_cache, kv_scale)
        decode = t and num_seqs and t < 4 * num_seqs
        if decode and self.decode_attention == "auto":
            # the core's paged decode kernel from the window's first key (in-kernel combine,
            # block-table entries a round ahead): 3.68 against 3.91 ms a gemma-4-26b-a4b step
            # with swa_split at batch 1, 1k context (H200, session 22); at 512 its tensor-core
            # kernel past 512 keys (None below: swa_split)
            got = self.ctx.bind(AttentionOps).window_decode(
                q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale, window)
            if got is not None:
                return got
        out = self.ctx.out(q.shape, q.dtype)
        if not t or not num_seqs:
            return out
        if not decode:
            tile = self._tile
            if self._use_mma(q):
                fa = self.prefill_attention != "mma" and self.ctx.fits_smem(fa_shmem(d))
                tile = self._tile_fa if fa else self._tile_mma
            tile(out, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale, window)
        else:
            self._split(out, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale,
                        window)
        return out

    def _check(self, q: DeviceArray, k_cache: DeviceArray, v_cache: DeviceArray,
               kv_scale: float) -> None:
        t, h, d = q.shape
        kh = k_cache.shape[2]
        if d not in HEAD_DIMS or k_cache.shape[3] != d:
            raise ValueError(f"sliding_window_attention: head_dim {d} (cache {k_cache.shape[3]})"
                             f" unsupported on cuda; use one of {HEAD_DIMS}")
        if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype or kv_scale != 1.0:
            raise TypeError("sliding_window_attention: the cuda kernels read a KV cache in the "
                            f"activation dtype ({q.dtype}, kv_scale 1), got {k_cache.dtype}; "
                            "use --kv-cache-dtype auto for Gemma models")
        if h % kh:
            raise ValueError(f"sliding_window_attention: {h} query heads are not a multiple of "
                             f"{kh} KV heads")

    def _args(self, q, k_cache, block_tables, seq_lens, splits, scale, window) -> tuple:
        _, h, _ = q.shape
        _, block_size, kh, _ = k_cache.shape
        return (h, kh, block_size, block_tables.shape[1], seq_lens.shape[0], splits,
                int(window) if window and window > 0 else 0, float(scale * LOG2E))

    def _split(self, out, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale,
               window) -> None:
        t, h, d = q.shape
        kh, var = k_cache.shape[2], variant_of(q.dtype)
        max_keys = block_tables.shape[1] * k_cache.shape[1]
        if window and window > 0:
            max_keys = min(max_keys, int(window))
        hb, splits = split_plan(t, h, kh, d, max_keys, self.ctx.num_sms)
        args = self._args(q, k_cache, block_tables, seq_lens, splits, scale, window)
        part_acc = part_ml = None
        if splits > 1:
            part_acc = self.ctx.out((t * h * splits * d,), np.float32)
            part_ml = self.ctx.out((t * h * splits * 2,), np.float32)
        kernel = self.ctx.kernels.kernel("gemma4_attention", var, f"swa_split_{var}_d{d}_h{hb}")
        self.ctx.launch(kernel, (t, kh * (h // kh // hb), splits), 128, out, part_acc, part_ml,
                        self.ctx.sync_counters(), q, k_cache, v_cache, block_tables, seq_lens,
                        cu_seqlens_q, *args, pdl=self.ctx.pdl)

    def _tile(self, out, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale,
              window) -> None:
        t, h, d = q.shape
        kh, var = k_cache.shape[2], variant_of(q.dtype)
        group = h // kh
        hb = next(n for n in TILE_HEADS if group % n == 0)
        tiles = -(-t // (TILE_ROWS // hb)) + seq_lens.shape[0]
        shmem = tile_shmem(d)
        kernel = self.ctx.kernels.kernel("gemma4_attention", var, f"swa_tile_{var}_d{d}_h{hb}",
                                         shmem)
        self.ctx.launch(kernel, (tiles, kh * (group // hb)), 128, out, q, k_cache, v_cache,
                        block_tables, seq_lens, cu_seqlens_q,
                        *self._args(q, k_cache, block_tables, seq_lens, 1, scale, window),
                        shmem=shmem)

    def _use_mma(self, q: DeviceArray) -> bool:
        return (q.dtype.name in ("bfloat16", "float16") and q.shape[2] in MMA_HEAD_DIMS
                and self.ctx.capability >= (8, 0) and self.ctx.policy.attention != "simt")

    def _tile_mma(self, out, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale,
                  window) -> None:
        self._tile_tc("swa_mma", mma_shmem, out, q, k_cache, v_cache, block_tables, seq_lens,
                      cu_seqlens_q, scale, window)

    def _tile_fa(self, out, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale,
                 window) -> None:
        self._tile_tc("swa_fa", fa_shmem, out, q, k_cache, v_cache, block_tables, seq_lens,
                      cu_seqlens_q, scale, window)

    def _tile_tc(self, name, shmem_of, out, q, k_cache, v_cache, block_tables, seq_lens,
                 cu_seqlens_q, scale, window) -> None:
        """A tensor-core prefill kernel (``swa_mma`` / ``swa_fa``: same grid and arguments)."""
        t, h, d = q.shape
        kh, var = k_cache.shape[2], variant_of(q.dtype)
        group = h // kh
        hb = next(n for n in MMA_HEADS if group % n == 0)
        tiles = -(-t // (MMA_ROWS // hb)) + seq_lens.shape[0]
        shmem = shmem_of(d)
        kernel = self.ctx.kernels.kernel("gemma4_attention_mma", var,
                                         f"{name}_{var}_d{d}_h{hb}", shmem)
        self.ctx.launch(kernel, (tiles, kh * (group // hb), d // min(d, 256)), 128, out, q,
                        k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
                        *self._args(q, k_cache, block_tables, seq_lens, 1, scale, window),
                        shmem=shmem)
