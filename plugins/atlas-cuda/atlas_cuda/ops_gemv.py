"""Decode GEMVs of the cuda backend (at most 8 rows of ``x``): ``linear``'s small-M path, the
fused ``linear_act_and_mul`` and ``rms_norm_linear`` (``kernels/cuda/common/linear.cu``,
``gemv_fused.cu``, ``gemv_norm.cu``)."""

from __future__ import annotations

from atlas_core.ops.norm import compose_rms_norm_linear
from atlas_cuda import env as cuda_env
from atlas_cuda.array import DeviceArray
from atlas_cuda.kernels_loader import variant_of

#: Largest M served by the GEMV kernels; above it bf16/f16 go to the tensor-core GEMM.
GEMV_MAX_M = 8
#: Output columns per 256-thread GEMV block (a warp per column).
_COLS_PER_BLOCK = 8
#: Dynamic shared memory of the fused norm GEMV (the normed rows, ``rows * K`` elements).
NORM_GEMV_SHMEM = 64 << 10
#: Blocks ``auto`` aims for at least (about one per SM of an H200), splitting K below it.
_MIN_BLOCKS = 128
#: Kernels after which DRAM idles (one decode token's attention, a GDN recurrent step): the next
#: GEMV loads two weight groups before its PDL wait (:meth:`GemvOps._preload_two`).
_LATENCY_BOUND_MODULES = frozenset({"attention_rope_decode", "attention_decode", "delta_rule"})
#: Output columns from which a GEMV with K <= 2,048 (a small model's lm_head) takes two columns
#: per warp and no K split, so each warp keeps two weight groups in flight instead of one:
#: H200 batch 1, qwen3-30b-a3b's lm_head (151,936 x 2,048) 415.5 -> 421.6 tok/s against one
#: column and two splits (four columns 420.2, one column and no split 419.2; session 11).
_WIDE_N = 16384
#: Weights (N * K) up to which the fused norm GEMV takes four columns per warp.
_SMALL_NORM_GEMV = 12 << 20


def _row_tiles(M: int):
    """``(m0, rows kernel variant)`` for each tile of at most :data:`GEMV_MAX_M` rows."""
    for m0 in range(0, M, GEMV_MAX_M):
        yield m0, next(t for t in (1, 2, 4, 8) if t >= min(M - m0, GEMV_MAX_M))


def gemv_tile(N: int, K: int, fused_norm: bool = False, pair: bool = False) -> tuple[int, int]:
    """``(G, S)`` of a ``gemv_norm.cu`` launch: G output columns per warp, S warps splitting K
    (``ATLAS_CUDA_GEMV_TILE``). ``auto``, from the qwen3-8b shapes on an H200
    (docs/benchmarks.md, session 4): ``linear`` with N in 2048..4096 (o_proj, the 8B down) takes
    four columns per warp and splits K until there are about two blocks per SM (2 x
    :data:`_MIN_BLOCKS`; 8B o_proj 11.2 -> 9.8 us, down 29.7 -> 25.5, the MoE models' o_proj 6.9
    -> 5.8); other shapes four K splits for K >= 8192, two columns and no split for K <= 2,048
    and at least :data:`_WIDE_N` columns (a small model's lm_head), else two splits. The
    fused norm GEMV reads two weight rows per warp (two columns, or the gate and up row of
    one), four columns for matrices of at most :data:`_SMALL_NORM_GEMV` weights (30B qkv 8.9 ->
    7.4 us), one below 1,024 columns (a MoE router), no split. Small grids split K further
    until they have :data:`_MIN_BLOCKS` blocks."""
    tile = cuda_env.gemv_tile()
    if tile not in ("auto", "old"):
        return min(int(tile[1]), 2 if pair else 4), int(tile[3])
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
    """Mixed into :class:`atlas_cuda.ops.CudaOps`."""

    def _l2_prefetch(self, weight: DeviceArray) -> int:
        """1 when a decode GEMV should ask L2 for all of ``weight`` before its PDL wait: PDL on
        and the matrix within ``ATLAS_CUDA_GEMV_PREFETCH_MB`` and 3/4 of the L2 cache."""
        limit = min(cuda_env.gemv_prefetch_mb() * (1 << 20), 0.75 * self.be.l2_bytes)
        return int(bool(self._pdl) and weight.nbytes <= limit)

    def _preload_two(self) -> bool:
        """Whether a one-row decode GEMV without the norm prologue should load its second weight
        group before the PDL wait too (the ``_p2`` kernels; ``ATLAS_CUDA_GEMV_PRELOAD``;
        ``auto``: right after a latency-bound kernel, decode attention or a GDN recurrent step,
        that leaves DRAM idle; after a GEMV the early loads only slow that GEMV's tail)."""
        mode = cuda_env.gemv_preload()
        if mode == "auto":
            return self.be.kernels.last_module in _LATENCY_BOUND_MODULES
        return mode == "two"

    def _gemv(self, y: DeviceArray, x: DeviceArray, weight: DeviceArray,
              bias: DeviceArray | None, M: int, N: int, K: int) -> None:
        """``y = x @ weight.T + bias`` for 16-byte aligned operands, K a multiple of 8: a warp
        per output column; ``ATLAS_CUDA_GEMV_CHUNKS`` picks 4 or 8 loads in flight per lane."""
        v = variant_of(x.dtype)
        if cuda_env.gemv_tile() != "old":
            g, s = gemv_tile(N, K)
            for m0, mt in _row_tiles(M):
                p2 = "p2_" if mt == 1 and self._preload_two() else ""
                k = self.be.kernels.kernel("gemv_norm", v, f"gemvn_{p2}{v}_m{mt}_g{g}")
                self.be.kernels.launch(k, -(-N // (8 // s * g)), 256, y, x, weight, bias, M, N,
                                       K, m0, s, self._l2_prefetch(weight), pdl=self._pdl)
            return
        module, name = ("gemv_fused", "gemv8") if cuda_env.gemv_chunks() == 8 else ("linear", "gemv")
        for m0, mt in _row_tiles(M):
            k = self.be.kernels.kernel(module, v, f"{name}_{v}_m{mt}")
            self.be.kernels.launch(k, -(-N // _COLS_PER_BLOCK), 32 * _COLS_PER_BLOCK, y, x,
                                   weight, bias, M, N, K, m0, pdl=self._pdl)

    def linear_act_and_mul(self, x: DeviceArray, weight: DeviceArray,
                           bias: DeviceArray | None = None, activation: str = "silu"):
        """``act(x @ Wg.T + bg) * (x @ Wu.T + bu)`` for ``weight = [Wg; Wu]`` ``[2d, K]``; see
        :func:`atlas_core.ops.norm.linear_act_and_mul`. ``[..., K]`` -> ``[..., d]``, x.dtype.

        One kernel for at most 8 rows when ``ATLAS_CUDA_FUSE_GATE_UP=1`` (the projection is
        never written out); otherwise ``linear`` then the gated activation."""
        if activation not in ("silu", "gelu_tanh", "gelu_pytorch_tanh"):
            raise ValueError(f"linear_act_and_mul: unsupported activation {activation!r}; "
                             "use silu or gelu_tanh")
        K, two_d = x.shape[-1], weight.shape[0]
        M = x.size // K if K else 0
        if two_d % 2:
            raise ValueError(f"linear_act_and_mul: weight has {two_d} rows; gate and up need an "
                             "even count")
        d = two_d // 2
        fused = (cuda_env.fuse_gate_up() and 0 < M <= GEMV_MAX_M and K % 8 == 0
                 and all(a is None or a.ptr % 16 == 0 for a in (x, weight)))
        if not fused:
            gate_up = self.linear(x, weight, bias)
            return self._act_and_mul(gate_up, "silu_and_mul" if activation == "silu"
                                     else "gelu_tanh_and_mul")
        y = self._out((*x.shape[:-1], d), x.dtype)
        v = variant_of(x.dtype)
        gelu = int(activation != "silu")
        for m0, mt in _row_tiles(M):
            k = self.be.kernels.kernel("gemv_fused", v, f"gemv_act_mul_{v}_m{mt}")
            self.be.kernels.launch(k, -(-d // _COLS_PER_BLOCK), 32 * _COLS_PER_BLOCK, y, x,
                                   weight, bias, M, d, K, m0, gelu, pdl=self._pdl)
        return y

    def rms_norm_linear(self, x: DeviceArray, residual: DeviceArray | None,
                        norm_weight: DeviceArray, eps: float, weight: DeviceArray,
                        bias: DeviceArray | None = None, zero_centered: bool = False,
                        activation: str | None = None):
        """``linear(rms_norm(x, norm_weight, eps, residual), weight, bias)`` (with
        ``activation``: ``linear_act_and_mul`` of the normed rows); see
        :func:`atlas_core.ops.norm.rms_norm_linear`. Returns ``(y, residual_out)``.

        At most 8 rows (``ATLAS_CUDA_NORM_GEMV=1``, 16-byte aligned, K a multiple of 8): one
        ``gemv_norm.cu`` kernel whose every block normalises the rows itself while its first
        weight loads are in flight; otherwise ``rms_norm`` then the projection."""
        if activation not in (None, "silu", "gelu_tanh", "gelu_pytorch_tanh"):
            raise ValueError(f"rms_norm_linear: unsupported activation {activation!r}; "
                             "use None, silu or gelu_tanh")
        rows_w = weight.shape[0]
        if activation is not None and rows_w % 2:
            raise ValueError(f"rms_norm_linear: weight has {rows_w} rows; gate and up need an "
                             "even count")
        if not self._norm_gemv_fusable(x, residual, norm_weight, weight):
            return compose_rms_norm_linear(self, x, residual, norm_weight, eps, weight, bias,
                                           zero_centered, activation)
        y, r, _ = self._norm_gemv(x, residual, norm_weight, eps, weight, bias, zero_centered,
                                  activation)
        return y, (r if residual is not None else x)

    def _norm_gemv_fusable(self, x, residual, norm_weight, weight) -> bool:
        """Whether ``gemv_norm.cu``'s fused norm GEMV serves these operands."""
        K = x.shape[-1]
        M = x.size // K if K else 0
        return (cuda_env.norm_gemv() and 0 < M <= GEMV_MAX_M and K % 8 == 0
                and next(_row_tiles(M))[1] * K * x.dtype.itemsize <= NORM_GEMV_SHMEM
                and weight.dtype == x.dtype and norm_weight.dtype == x.dtype
                and all(a is None or a.ptr % 16 == 0 for a in (x, residual, norm_weight, weight)))

    def _norm_gemv(self, x, residual, norm_weight, eps, weight, bias, zero_centered,
                   activation, normed: bool = False):
        """One fused norm GEMV launch per row tile: ``(y, summed residual or None, the normed
        rows when ``normed`` else None)``."""
        K, rows_w = x.shape[-1], weight.shape[0]
        M = x.size // K
        n = rows_w // 2 if activation else rows_w
        y = self._out((*x.shape[:-1], n), x.dtype)
        r = self._out(x.shape, x.dtype) if residual is not None else None
        h = self._out(x.shape, x.dtype) if normed else None
        v = variant_of(x.dtype)
        g, s = gemv_tile(n, K, fused_norm=True, pair=activation is not None)
        name = "gemvn_norm_act" if activation else "gemvn_norm"
        extra = (int(activation != "silu"),) if activation else ()
        for m0, mt in _row_tiles(M):
            shmem = mt * K * x.dtype.itemsize
            k = self.be.kernels.kernel("gemv_norm", v, f"{name}_{v}_m{mt}_g{g}", NORM_GEMV_SHMEM)
            self.be.kernels.launch(k, -(-n // (8 // s * g)), 256, y, r, h, x, residual,
                                   norm_weight, float(eps), int(zero_centered), weight, bias, M,
                                   n, K, m0, s, self._l2_prefetch(weight), *extra, shmem=shmem,
                                   pdl=self._pdl)
        return y, r, h
