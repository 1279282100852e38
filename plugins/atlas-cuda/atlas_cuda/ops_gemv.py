"""Decode GEMVs of the cuda backend (at most 8 rows of ``x``): ``linear``'s small-M path, the
fused ``rms_norm_linear`` and the two-norm gated GEMV of Gemma's ``ffn_in``
(``kernels/cuda/common/gemv_norm.cu``)."""

from __future__ import annotations

from typing import Any

from atlas_core.api import compose_rms_norm_linear
from atlas_cuda.array import DeviceArray
from atlas_cuda.kernels_loader import variant_of
from atlas_cuda.ops_quant import QuantOps, QuantizedWeight

#: Largest M per launch of the GEMV kernels (row tiles of 1, 2, 4, 8; f32 tiles any M).
GEMV_MAX_M = 8
#: Rows up to which a bf16/f16 linear takes the GEMV (policy ``gemv_rows`` ``auto``); more take
#: cuBLASLt / the mma GEMM. Measured, H200 qwen3-8b at 512 tokens of context (scripts/
#: sweep_knob.sh, 2026-11-27): the GEMV's step time grows with each row (1/2/4/8 rows: 4.25,
#: 6.58, 10.16, 17.64 ms) while the tensor-core path stays flat (2 rows 5.03 ms, 4 rows 5.21).
DENSE_GEMV_ROWS = 1
#: Dynamic shared memory of the fused norm GEMV (the normed rows, ``rows * K`` elements).
NORM_GEMV_SHMEM = 64 << 10
#: Blocks ``auto`` aims for at least (about one per SM of an H200), splitting K below it.
_MIN_BLOCKS = 128
#: Kernels after which DRAM idles (one decode token's attention, a GDN or Mamba-2 step): the next
#: GEMV loads two weight groups before its PDL wait (:meth:`GemvOps._preload_two`).
_LATENCY_BOUND_MODULES = frozenset({"attention_rope_decode", "attention_decode",
                                    "attention_decode_mma", "delta_rule", "mamba2",
                                    "mamba2_decode"})
#: Output columns from which a GEMV with K <= 2,048 (a small model's lm_head) takes two columns
#: per warp and no K split, so each warp keeps two weight groups in flight instead of one:
#: H200 batch 1, qwen3-30b-a3b's lm_head (151,936 x 2,048) 415.5 -> 421.6 tok/s against one
#: column and two splits (four columns 420.2, one column and no split 419.2; session 11).
_WIDE_N = 16384
#: Weights (N * K) up to which the fused norm GEMV takes four columns per warp.
_SMALL_NORM_GEMV = 12 << 20
#: Widest row of the norm prologue's one-pass path (``norm_rows.cuh``: 8 * ``NORM_KC`` * 256
#: threads), the only path of ``gemvn_norm2_act``.
NORM_ONE_PASS_K = 8192
#: Gated activations of ``gemvn_norm2_act`` (its ``gelu`` flag: not ``silu``).
_GATED = ("silu", "gelu_tanh", "gelu_pytorch_tanh")


def gemv_rows(policy: Any) -> int:
    """The most rows of ``x`` a dense linear serves with the GEMV kernels: the policy's
    ``gemv_rows`` (``ATLAS_CUDA_GEMV_ROWS``), ``auto`` :data:`DENSE_GEMV_ROWS`; 0 (never, nor
    the fused norm GEMV) in batch-invariant mode, where every bf16/f16 linear takes the mma
    GEMM so a row rounds the same however many rows share the call."""
    if getattr(policy, "batch_invariant", False):
        return 0
    return policy.gemv_rows or DENSE_GEMV_ROWS


def _row_tiles(M: int):
    """``(m0, rows kernel variant)`` for each tile of at most :data:`GEMV_MAX_M` rows."""
    for m0 in range(0, M, GEMV_MAX_M):
        yield m0, next(t for t in (1, 2, 4, 8) if t >= min(M - m0, GEMV_MAX_M))


def gemv_tile(N: int, K: int, fused_norm: bool = False, pair: bool = False,
              forced: tuple[int, int] | None = None) -> tuple[int, int]:
    """``(G, S)`` of a ``gemv_norm.cu`` launch: G output columns per warp, S warps splitting K;
    ``forced``: the policy's ``gemv_tile`` (``ATLAS_CUDA_GEMV_TILE``), G capped at 2 for a
    ``pair`` (gate and up row per column). Else, from the qwen3-8b shapes on an H200
    (docs/benchmarks.md, session 4): ``linear`` with N in 2048..4096 (o_proj, the 8B down) takes
    four columns per warp and splits K until there are about two blocks per SM (2 x
    :data:`_MIN_BLOCKS`; 8B o_proj 11.2 -> 9.8 us, down 29.7 -> 25.5, the MoE models' o_proj 6.9
    -> 5.8); other shapes four K splits for K >= 8192, two columns and no split for K <= 2,048
    and at least :data:`_WIDE_N` columns (a small model's lm_head), else two splits. The
    fused norm GEMV reads two weight rows per warp (two columns, or the gate and up row of
    one), four columns for matrices of at most :data:`_SMALL_NORM_GEMV` weights (30B qkv 8.9 ->
    7.4 us), one below 1,024 columns (a MoE router), no split. Small grids split K further
    until they have :data:`_MIN_BLOCKS` blocks."""
    if forced is not None:
        return min(forced[0], 2 if pair else 4), forced[1]
    if fused_norm:
        g, s = (1 if pair or N < 1024 else 4 if N * K <= _SMALL_NORM_GEMV else 2), 1
    elif 2048 <= N <= 4096:
        g, s = 4, 1
        while s < 8 and -(-N // (8 // s * g)) < 2 * _MIN_BLOCKS and K >= 1024 * s:
            s *= 2
    elif K >= 8192:
        g, s = 1, 4
    elif K <= 2048 and N >= _WIDE_N:
        g, s = 2, 1
    else:
        g, s = 1, 2
    while s < 8 and -(-N // (8 // s * g)) < _MIN_BLOCKS and K >= 512 * s:
        s *= 2
    return g, s


class GemvOps:
    """The decode GEMVs (``gemv_norm.cu``): ``linear`` of at most 8 rows (:meth:`gemv`, called
    by :class:`~atlas_cuda.ops.DenseOps`), the fused ``rms_norm_linear`` and the norm + router
    GEMV of :class:`~atlas_cuda.ops_moe.MoeOps` (:meth:`norm_gemv`).

    Args:
        ctx: the backend's :class:`~atlas_cuda.context.OpContext`.
    """

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def _preload_two(self) -> bool:
        """Whether a one-row decode GEMV without the norm prologue loads its second weight group
        before the PDL wait too (the ``_p2`` kernels): right after a latency-bound kernel,
        decode attention or a GDN recurrent step, that leaves DRAM idle; after a GEMV the early
        loads only slow that GEMV's tail (H200 batch 1, da7762b: qwen3-30b-a3b 404.3 -> 411.4
        tok/s; ``two`` everywhere: qwen3-8b 238.8 -> 229.3)."""
        return self.ctx.kernels.last_module in _LATENCY_BOUND_MODULES

    def gemv(self, y: DeviceArray, x: DeviceArray, weight: DeviceArray,
             bias: DeviceArray | None, M: int, N: int, K: int) -> None:
        """``y = x @ weight.T + bias`` for 16-byte aligned operands, K a multiple of 8, M at most
        :data:`GEMV_MAX_M` per row tile: ``gemv_norm.cu``'s tiled GEMV (:func:`gemv_tile`)."""
        ctx = self.ctx
        v = variant_of(x.dtype)
        g, s = gemv_tile(N, K, forced=ctx.policy.gemv_tile)
        for m0, mt in _row_tiles(M):
            p2 = "p2_" if mt == 1 and self._preload_two() else ""
            k = ctx.kernels.kernel("gemv_norm", v, f"gemvn_{p2}{v}_m{mt}_g{g}")
            ctx.launch(k, -(-N // (8 // s * g)), 256, y, x, weight, bias, M, N, K, m0, s, 0,
                       pdl=ctx.pdl)

    def rms_norm_linear(self, x: DeviceArray, residual: DeviceArray | None,
                        norm_weight: DeviceArray, eps: float, weight: DeviceArray,
                        bias: DeviceArray | None = None, zero_centered: bool = False,
                        activation: str | None = None):
        """``linear(rms_norm(x, norm_weight, eps, residual), weight, bias)`` (with
        ``activation``: ``linear_act_and_mul`` of the normed rows); see
        :func:`atlas_core.ops.norm.rms_norm_linear`. Returns ``(y, residual_out)``.

        At most 8 rows (16-byte aligned, K a multiple of 8): one ``gemv_norm.cu`` kernel whose
        every block normalises the rows itself while its first weight loads are in flight;
        otherwise ``rms_norm`` then the projection."""
        if isinstance(weight, QuantizedWeight):
            return self.ctx.bind(QuantOps).rms_norm_linear(x, residual, norm_weight, eps, weight,
                                                           bias, zero_centered, activation)
        if activation not in (None, "silu", "gelu_tanh", "gelu_pytorch_tanh"):
            raise ValueError(f"rms_norm_linear: unsupported activation {activation!r}; "
                             "use None, silu or gelu_tanh")
        rows_w = weight.shape[0]
        if activation is not None and rows_w % 2:
            raise ValueError(f"rms_norm_linear: weight has {rows_w} rows; gate and up need an "
                             "even count")
        if not self.norm_gemv_fusable(x, residual, norm_weight, weight):
            return compose_rms_norm_linear(self.ctx.ops, x, residual, norm_weight, eps, weight,
                                           bias, zero_centered, activation)
        y, r, _ = self.norm_gemv(x, residual, norm_weight, eps, weight, bias, zero_centered,
                                 activation)
        return y, (r if residual is not None else x)

    def norm_gemv_fusable(self, x, residual, norm_weight, weight) -> bool:
        """Whether ``gemv_norm.cu``'s fused norm GEMV serves these operands."""
        K = x.shape[-1]
        M = x.size // K if K else 0
        return (0 < M <= gemv_rows(self.ctx.policy) and K % 8 == 0
                and next(_row_tiles(M))[1] * K * x.dtype.itemsize <= NORM_GEMV_SHMEM
                and weight.dtype == x.dtype and norm_weight.dtype == x.dtype
                and all(a is None or a.ptr % 16 == 0 for a in (x, residual, norm_weight, weight)))

    def norm_gemv(self, x, residual, norm_weight, eps, weight, bias, zero_centered,
                  activation, normed: bool = False):
        """One fused norm GEMV launch per row tile: ``(y, summed residual or None, the normed
        rows when ``normed`` else None)``."""
        K, rows_w = x.shape[-1], weight.shape[0]
        M = x.size // K
        n = rows_w // 2 if activation else rows_w
        ctx = self.ctx
        y = ctx.out((*x.shape[:-1], n), x.dtype)
        r = ctx.out(x.shape, x.dtype) if residual is not None else None
        h = ctx.out(x.shape, x.dtype) if normed else None
        v = variant_of(x.dtype)
        g, s = gemv_tile(n, K, fused_norm=True, pair=activation is not None,
                         forced=ctx.policy.gemv_tile)
        name = "gemvn_norm_act" if activation else "gemvn_norm"
        extra = (int(activation != "silu"),) if activation else ()
        for m0, mt in _row_tiles(M):
            shmem = mt * K * x.dtype.itemsize
            k = ctx.kernels.kernel("gemv_norm", v, f"{name}_{v}_m{mt}_g{g}", NORM_GEMV_SHMEM)
            ctx.launch(k, -(-n // (8 // s * g)), 256, y, r, h, x, residual, norm_weight,
                       float(eps), int(zero_centered), weight, bias, M, n, K, m0, s, 0, *extra,
                       shmem=shmem, pdl=ctx.pdl)
        return y, r, h

    def norm2_gemv_fusable(self, x, residual, x_weight, norm_weight, norm2_weight, weight, bias,
                           activation) -> bool:
        """Whether ``gemvn_norm2_act`` serves :meth:`norm2_gemv`'s operands: a gated activation,
        a residual of x's shape, a plain (not quantized) weight, those of
        :meth:`norm_gemv_fusable`, K within the one-pass prologue (:data:`NORM_ONE_PASS_K`),
        ``x_weight`` and ``norm2_weight`` (None: not written) and ``bias`` in x's dtype, the
        weights 16-byte aligned; float32 one row only (its kernels of 2-8 rows are not built)."""
        if (activation not in _GATED or residual is None or x_weight is None
                or isinstance(weight, QuantizedWeight) or weight.shape[0] % 2):
            return False
        K = x.shape[-1]
        return (self.norm_gemv_fusable(x, residual, norm_weight, weight)
                and K <= NORM_ONE_PASS_K and residual.shape == x.shape
                and (x.dtype.itemsize == 2 or x.size == K)
                and (bias is None or bias.dtype == x.dtype)
                and all(w is None or (w.dtype == x.dtype and w.ptr % 16 == 0)
                        for w in (x_weight, norm2_weight)))

    def norm2_gemv(self, x, residual, x_weight, norm_weight, norm2_weight, eps, weight, bias,
                   zero_centered, activation):
        """One ``gemvn_norm2_act`` launch per row tile (see :meth:`norm2_gemv_fusable`):
        ``h = rms_norm(x, x_weight) + residual``, then ``(act(gate(n)) * up(n), h,
        rms_norm(h, norm2_weight) or None)`` for ``n = rms_norm(h, norm_weight)`` and
        ``weight`` = ``[gate; up]``; every step rounded as the separate ops store it, the two
        norms of ``h`` written by block 0. One column a warp (the only tile built; a forced
        ``gemv_tile`` sets the K splits only)."""
        K, n = x.shape[-1], weight.shape[0] // 2
        M = x.size // K
        ctx = self.ctx
        y = ctx.out((*x.shape[:-1], n), x.dtype)
        r = ctx.out(x.shape, x.dtype)
        h2 = ctx.out(x.shape, x.dtype) if norm2_weight is not None else None
        v = variant_of(x.dtype)
        _, s = gemv_tile(n, K, fused_norm=True, pair=True, forced=ctx.policy.gemv_tile)
        for m0, mt in _row_tiles(M):
            k = ctx.kernels.kernel("gemv_norm", v, f"gemvn_norm2_act_{v}_m{mt}_g1",
                                   NORM_GEMV_SHMEM)
            ctx.launch(k, -(-n // (8 // s)), 256, y, r, h2, x, residual, x_weight,
                       norm_weight, norm2_weight, float(eps), int(zero_centered), weight, bias,
                       M, n, K, m0, s, 0, int(activation != "silu"),
                       shmem=mt * K * x.dtype.itemsize, pdl=ctx.pdl)
        return y, r, h2
