"""Quantized linears of the cuda backend (``kernels/cuda/common/quant_*.cu``): the weight ops
given a :class:`~atlas_core.ops.quant.QuantizedWeight` instead of an array.

* 1 to :data:`QSKINNY_MAX_M` rows of bf16 / f16 activations, ``K`` a multiple of 128 (policy
  ``quant_kernel`` ``auto``/``skinny``): the decode skinny GEMM of ``quant_skinny.cu``, weights
  the tensor-core A operand, decoded with integer ops (no float conversions), each weight byte
  read once a launch; 1 to 8 rows cost the same.
* Else (policy ``legacy``, f32 activations, other shapes), at most :data:`QUANT_GEMV_ROWS` rows (policy ``gemv_rows``): W8A16 / W4A16 GEMVs that
  stream each weight byte once with 16-byte loads and dequantize in registers
  (``quant_linear.cu``).
* Up to :data:`QGEMM_MAX_M` rows (bf16 / f16): the skinny tensor-core GEMM of
  ``quant_gemm.cu``, weights dequantized in registers into ``mma.sync`` fragments, each weight
  byte read once per 64 rows.
* More rows on a target whose ``HARDWARE.toml`` turns on ``[quant] fp4_mma`` (GB10), NVFP4
  weights: the block-scaled FP4 MMA (:mod:`atlas_cuda.quant_fp4_mma`).
* Else more rows (prefill), or f32 activations past the GEMV: the weight is dequantized to the
  activation dtype into a scratch buffer kept by the backend, then the dense tensor-core path
  (cuBLASLt, else the ``mma.sync`` GEMM) runs on it. That costs one extra read of the quantized
  weight and a write plus a read of its bf16 copy (about 5 bytes an element for FP8, 4.5 for
  NVFP4) on top of the GEMM's: small next to a long prefill chunk's matmul.

Device layout: the arrays of :mod:`atlas_core.ops.quant`, each its own allocation (256-byte
aligned by ``cuMemAlloc``). The GEMVs need rows that start on 16 bytes: ``K`` a multiple of 16
(FP8) or 32 (NVFP4), and FP8 block scales at least 16 wide; other shapes take the dequantize
path, which has no alignment needs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.api import compose_rms_norm_linear
from atlas_core.api import QuantizedWeight
from atlas_cuda.array import DeviceArray
from atlas_cuda.kernels_loader import variant_of
from atlas_cuda.memory import require_eager
from atlas_cuda.quant_fp4_mma import Fp4Mma, fp4_mma_enabled, fp4_mma_servable

#: Largest M per launch of the quantized GEMVs.
QGEMV_MAX_M = 8
#: Rows up to which a quantized linear takes the GEMV (policy ``gemv_rows`` ``auto``); more take
#: the skinny GEMM. Measured, H200 qwen3-8b-fp8 / -nvfp4 at 512 tokens (scripts/sweep_knob.sh,
#: 2026-11-27): 2 rows GEMV 6.23 / 6.80 ms against the GEMM's 6.66 / 8.78; 4 rows GEMM 7.03 /
#: 8.98 against 9.24 / 10.48.
QUANT_GEMV_ROWS = 2
#: Largest M the skinny quantized GEMM serves; above it the weight is dequantized for the GEMM.
QGEMM_MAX_M = 64
_ROW_TILES = (1, 2, 4, 8)
#: Largest M the decode skinny GEMM (``quant_skinny.cu``) serves: 8 n-tiles of 8 rows.
QSKINNY_MAX_M = 64
#: Steps of weight loads a lane of ``qskinny_*`` keeps in flight, by (format, n-tiles); 1 where
#: not listed. Measured, H200, qwen3-8b's four projections (scripts/quant_skinny_bench.py,
#: 2026-11-27), us a layer at 1 / 8 / 16 rows, depth 1 / 2 / 3: FP8 69.7 / 76.1 / 72.2 at one
#: row (more registers cost occupancy); NVFP4 (half the bytes a step) 72.1 / 70.6 / 57.7 at one
#: row, 61.6 at 8 rows with 3, and 96.0 (1) / 96.9 (3) at 16.
#: ``dense`` (``qskinny_dense_*``, weights in the activation dtype, policy ``gemm=skinny``): not
#: measured yet; the fewest registers where the tile is wide (n4 d1: 166, n1 d2: 128 on sm_90a).
SKINNY_DEPTH = {("nvfp4", 1): 3, ("nvfp4", 2): 3, ("dense", 1): 2}
#: ``qskinny2_*`` (weights streamed through a per-lane shared-memory ring with cp.async) by
#: (format, n-tiles): (weight tiles a warp MT, ring depth D). Set from the sweep of
#: scripts/quant_skinny_bench.py --sweep (docs/benchmarks.md); an entry missing here keeps the
#: register-ring ``qskinny_*``. The default build instantiates exactly these (QSKINNY2_DEFAULT
#: in quant_skinny.cu must list the same). ``dense`` has none until scripts/dense_skinny_bench.py
#: has measured its ring form (QSKINNY2_DENSES: MT 1, depths 3 and 4).
SKINNY2_CONFIG: dict[tuple[str, int], tuple[int, int]] = {
    ("fp8", 1): (1, 3), ("fp8", 8): (2, 3),
    ("nvfp4", 2): (2, 4), ("nvfp4", 4): (2, 4), ("nvfp4", 8): (2, 4)}
#: Rows up to which rms_norm_linear over a quantized weight is one fused-norm skinny launch.
#: Every block normalises all rows itself (x and residual from L2): H200, qwen3-8b-fp8 at 1,024
#: tokens, batch 1 3.55 -> 3.26 ms and batch 8 4.18 -> 5.82 with the fusion and the qskinny2
#: FP8 configuration changed together; the sweep measured that configuration faster at 8 rows
#: (69.4 -> 64.8 us), so the batch-8 loss is put down to the fusion (64 KiB of rows read and
#: held per block; not measured alone). From 3 rows on rms_norm runs first.
SKINNY_NORM_ROWS = 2
#: Shared memory the fused-norm skinny kernels may take for the normed rows (M x K of x):
#: 8 rows of K 6,144 in bf16.
SKINNY_NORM_XS = 96 << 10
#: Static shared memory of the ``qskinny2_*`` kernels at most (ptxas: 128 bytes), added to their
#: dynamic ring when checking it fits a block (``OpContext.fits_smem``).
SKINNY2_STATIC = 256
#: Blocks a SM the K split of the skinny kernels aims the grid at (:func:`skinny_splits`).
SKINNY_BLOCKS_PER_SM = 2
#: Elements one 16-byte load of weight data holds, by format (FP8 formats: 16).
ELEMS = {"nvfp4": 32}
_GRID_CAP = 1 << 15


def has_quantized(*weights: Any) -> bool:
    """Whether any of ``weights`` is a :class:`QuantizedWeight` (the dense op classes then
    hand the call to :class:`QuantOps`)."""
    return any(isinstance(w, QuantizedWeight) for w in weights)


def fp8_scale_args(w: QuantizedWeight) -> tuple[int, int, int, int]:
    """``(bn, bk, s_row, s_lead)`` with which the kernels index an FP8 scale: element
    ``(e, n, k)`` reads ``scale[e * s_lead + (n // bn) * s_row + k // bk]``."""
    *_, n, k = w.shape
    if w.format == "fp8_tensor":
        return n, k, 0, 1
    if w.format == "fp8_channel":
        return 1, k, 1, n
    bn, bk = w.block_size
    cols = -(-k // bk)
    return bn, bk, cols, -(-n // bn) * cols


def kernel_operands(w: QuantizedWeight) -> tuple[str, tuple, tuple]:
    """``(kernel format, scale operands, trailing int operands)`` of ``w`` for the
    ``quant_*.cu`` kernels: NVFP4 passes its scales and global scale, FP8 its scales and
    ``(bn, bk, s_row)`` (:func:`fp8_scale_args`)."""
    if w.format == "nvfp4":
        return "nvfp4", (w.scale, w.global_scale), ()
    return "fp8", (w.scale,), fp8_scale_args(w)[:3]


def gemv_splits(N: int, K: int, fmt: str, num_sms: int) -> int:
    """Warps S splitting K of one column: doubled while the grid (``N * S / 8`` blocks) has
    fewer than two blocks per SM and every lane keeps at least two 16-byte loads."""
    elems = ELEMS.get(fmt, 16)
    s = 1
    while s < 8 and -(-N * s // 8) < 2 * num_sms and K // (elems * 32 * s * 2) >= 2:
        s *= 2
    return s


def skinny_splits(N: int, K: int, num_sms: int, rows: int = 16) -> int:
    """Warps S splitting K of one ``rows``-row weight tile in ``qskinny*``: doubled while the
    grid (``N / rows * S / 8`` blocks) has fewer than :data:`SKINNY_BLOCKS_PER_SM` blocks per SM
    and every warp keeps at least two 128-element steps."""
    tiles, s = -(-N // rows), 1
    while (s < 8 and -(-tiles * s // 8) < SKINNY_BLOCKS_PER_SM * num_sms
           and K // (128 * s * 2) >= 2):
        s *= 2
    return s


def skinny2_smem(fmt: str, nt: int, mt: int, depth: int, splits: int) -> int:
    """Dynamic shared memory of one ``qskinny2_*`` block: 8 warps' rings (``depth`` steps of
    ``2 MT`` weight rows, 32 B a row for FP8, 16 for NVFP4, 64 for ``dense`` bf16 / f16, per
    lane), or the K-split reduction (8 warps x ``MT NT`` fragments of 4 floats per lane) if
    that is larger."""
    v = {"nvfp4": 1, "dense": 4}.get(fmt, 2)
    ring = 8 * depth * mt * 2 * v * 512
    return max(ring, 8 * mt * nt * 512 if splits > 1 else 0)


def skinny_servable(x: Any, w: QuantizedWeight) -> bool:
    """Whether ``qskinny_*`` takes these operands: bf16 / f16 activations, one matrix, ``K`` a
    multiple of 128, 16-byte aligned rows and FP8 blocks a multiple of 128 wide."""
    K = w.shape[-1]
    if x.dtype.itemsize != 2 or w.lead or K % 128 or x.ptr % 16 or w.data.ptr % 16:
        return False
    return w.format != "fp8_block" or w.block_size[1] % 128 == 0


def launch_skinny(ctx: Any, fmt: str, y: Any, x: Any, data: Any, scale: tuple, extra: tuple,
                  bias: Any, M: int, N: int, K: int, norm: tuple = ()) -> None:
    """One ``qskinny*`` launch (``M`` at most :data:`QSKINNY_MAX_M`): 8 warps a block, each
    ``16 MT`` weight rows (``qskinny2_*``, :data:`SKINNY2_CONFIG`; else 16, ``qskinny_*`` at
    :data:`SKINNY_DEPTH`) and a 1/S share of K (:func:`skinny_splits`), ``8 * NT`` rows of x.
    ``fmt``: ``fp8`` / ``nvfp4`` (``scale`` and ``extra``: :func:`kernel_operands`) or ``dense``
    (weights in the activation dtype, no scales). ``norm``: the ``(r_out, residual,
    norm_weight, eps, zero_centered)`` of a fused RMSNorm prologue (``*_norm_*`` kernels, at
    most 8 rows), x then being the rows before the norm."""
    v = variant_of(x.dtype)
    nt = next(t for t in (1, 2, 4, 8) if 8 * t >= M)
    kind = "_norm" if norm else ""
    xs_bytes = M * K * x.dtype.itemsize if norm else 0
    cfg = SKINNY2_CONFIG.get((fmt, nt))
    if cfg is not None:
        mt, d = cfg
        ring = skinny2_smem(fmt, nt, mt, d, 1)
        most = max(ring + SKINNY_NORM_XS if norm else 0,
                   skinny2_smem(fmt, nt, mt, d, 2))  # the most it ever asks
        if not ctx.fits_smem(most, SKINNY2_STATIC):
            cfg = None  # a fused-norm ring and its 96 KB of rows: over a GB10's 99 KB
    if cfg is not None:
        s = skinny_splits(N, K, ctx.num_sms, 16 * mt)
        smem = max(ring + xs_bytes, skinny2_smem(fmt, nt, mt, d, s))
        k = ctx.kernels.kernel("quant_skinny_ring", v,
                               f"qskinny2{kind}_{fmt}_{v}_n{nt}_m{mt}_d{d}", most)
        ctx.launch(k, -(-(-(-N // (16 * mt))) * s // 8), 256, y, x, data, *scale, bias,
                   M, N, K, s, *extra, *norm, shmem=smem, pdl=ctx.pdl)
        return
    s = skinny_splits(N, K, ctx.num_sms)
    d = SKINNY_DEPTH.get((fmt, nt), 1)
    k = ctx.kernels.kernel("quant_skinny", v, f"qskinny{kind}_{fmt}_{v}_n{nt}_d{d}",
                           SKINNY_NORM_XS if norm else 0)
    ctx.launch(k, -(-(-(-N // 16)) * s // 8), 256, y, x, data, *scale, bias, M, N, K, s,
               *extra, *norm, shmem=xs_bytes, pdl=ctx.pdl)


def gemm_columns(N: int, num_sms: int) -> int:
    """Column groups of 8 (TN) a warp of the skinny GEMM takes: the most (4, 2, 1) that still
    leave a block per SM."""
    return next((tn for tn in (4, 2) if -(-N // (8 * tn)) >= num_sms), 1)


def gemv_servable(x: Any, w: QuantizedWeight) -> bool:
    """Whether the quantized GEMV kernels take these operands (else: dequantize, then GEMM)."""
    K = w.shape[-1]
    if w.lead or x.ptr % 16 or w.data.ptr % 16:
        return False
    if w.format == "nvfp4":
        return K % 32 == 0
    return K % 16 == 0 and (w.format != "fp8_block" or w.block_size[1] % 16 == 0)


class QuantOps:
    """``linear``, ``linear_act_and_mul`` and ``rms_norm_linear`` over quantized weights (the
    dense op classes hand a :class:`QuantizedWeight` here; the MoE ops go to
    :class:`~atlas_cuda.quant_moe.QuantMoeOps`), the dequantization behind the large-M path and
    the device fill of random benchmark codes.

    Args:
        ctx: the backend's :class:`~atlas_cuda.context.OpContext`.
    """

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self._scratch: dict[int, list[DeviceArray]] = {}

    def linear(self, x: DeviceArray, weight: QuantizedWeight, bias: DeviceArray | None = None):
        """``x @ dequantize(weight).T + bias`` (:func:`atlas_core.ops.quant.dequantize`)."""
        N, K = weight.shape[-2:]
        if weight.lead:
            raise ValueError(f"linear: weight of shape {list(weight.shape)} is a stack; a "
                             "linear takes one [N, K] matrix")
        if x.shape[-1] != K:
            raise ValueError(f"linear: x has {x.shape[-1]} columns, the weight {K}")
        M = x.size // K if K else 0
        if (0 < M <= QSKINNY_MAX_M and self.ctx.policy.quant_kernel != "legacy"
                and skinny_servable(x, weight)):
            y = self.ctx.out((*x.shape[:-1], N), x.dtype)
            self.skinny(y, x, weight, bias, M, N, K)
            return y
        servable = gemv_servable(x, weight)
        mma = x.dtype.itemsize == 2
        rows = self.ctx.policy.gemv_rows or QUANT_GEMV_ROWS
        if M > QGEMM_MAX_M and fp4_mma_enabled(self.ctx) and fp4_mma_servable(x, weight):
            return self.ctx.bind(Fp4Mma).linear(x, weight, bias)
        if not servable or M > (QGEMM_MAX_M if mma else rows):
            return self.ctx.ops.linear(x, self.dequantize(weight, x.dtype, slot=0), bias)
        y = self.ctx.out((*x.shape[:-1], N), x.dtype)
        if M > rows:
            self.gemm(y, x, weight, bias, M, N, K)
        elif M:
            self.gemv(y, x, weight, bias, M, N, K)
        return y

    def gemv(self, y: DeviceArray, x: DeviceArray, w: QuantizedWeight,
             bias: DeviceArray | None, M: int, N: int, K: int) -> None:
        """One ``qgemv_*`` launch per tile of at most :data:`QGEMV_MAX_M` rows."""
        ctx = self.ctx
        v = variant_of(x.dtype)
        fmt, scale, extra = kernel_operands(w)
        s = gemv_splits(N, K, w.format, ctx.num_sms)
        for m0 in range(0, M, QGEMV_MAX_M):
            mt = next(t for t in _ROW_TILES if t >= min(M - m0, QGEMV_MAX_M))
            k = ctx.kernels.kernel("quant_linear", v, f"qgemv_{fmt}_{v}_m{mt}")
            ctx.launch(k, -(-N * s // 8), 256, y, x, w.data, *scale, bias, M, N, K, m0, s,
                       *extra, pdl=ctx.pdl)

    def skinny(self, y: DeviceArray, x: DeviceArray, w: QuantizedWeight,
               bias: DeviceArray | None, M: int, N: int, K: int, norm: tuple = ()) -> None:
        """One ``qskinny*`` launch over ``w`` (:func:`launch_skinny`)."""
        fmt, scale, extra = kernel_operands(w)
        launch_skinny(self.ctx, fmt, y, x, w.data, scale, extra, bias, M, N, K, norm)

    def gemm(self, y: DeviceArray, x: DeviceArray, w: QuantizedWeight,
             bias: DeviceArray | None, M: int, N: int, K: int) -> None:
        """One ``qgemm_*`` launch (``M`` at most :data:`QGEMM_MAX_M`): 8 warps a block, each
        block ``8 * TN`` columns (:func:`gemm_columns`), ``16 * MT`` rows."""
        ctx = self.ctx
        v = variant_of(x.dtype)
        fmt, scale, extra = kernel_operands(w)
        mt = next(t for t in (1, 2, 4) if 16 * t >= M)
        tn = gemm_columns(N, ctx.num_sms)
        k = ctx.kernels.kernel("quant_gemm", v, f"qgemm_{fmt}_{v}_m{mt}_n{tn}")
        ctx.launch(k, -(-N // (8 * tn)), 256, y, x, w.data, *scale, bias, M, N, K, 0, *extra,
                   pdl=ctx.pdl)

    def dequantize(self, w: QuantizedWeight, dtype: Any, slot: int | None = None) -> DeviceArray:
        """``dequantize(w)`` in ``dtype`` on the device: a step-workspace array, or with
        ``slot`` that one of the backend's reused dequantization buffers (valid until the next
        op dequantizes into the same slot; grown only outside graph capture)."""
        *_, N, K = w.shape
        v = variant_of(dtype)
        out = self.ctx.out(w.shape, dtype) if slot is None else self._scratch_array(
            slot, w.shape, dtype)
        total = out.size
        if not total:
            return out
        vector = w.data.ptr % 16 == 0 and K % (32 if w.format == "nvfp4" else 16) == 0 and (
            w.format != "fp8_block" or w.block_size[1] % 16 == 0)
        if w.format == "nvfp4" and vector:
            chunks = total // 32
            self.ctx.launch(self.ctx.kernels.kernel("quant_linear", v, f"qdequant32_nvfp4_{v}"),
                            min(-(-chunks // 256), _GRID_CAP), 256, out, w.data, w.scale,
                            w.global_scale, N, K, np.int64(chunks))
        elif w.format == "nvfp4":
            nbytes = total // 2
            self.ctx.launch(self.ctx.kernels.kernel("quant_linear", v, f"qdequant_nvfp4_{v}"),
                            min(-(-nbytes // 256), _GRID_CAP), 256, out, w.data, w.scale,
                            w.global_scale, N, K, np.int64(nbytes))
        elif vector:
            bn, bk, s_row, s_lead = fp8_scale_args(w)
            chunks = total // 16
            self.ctx.launch(self.ctx.kernels.kernel("quant_linear", v, f"qdequant16_fp8_{v}"),
                            min(-(-chunks // 256), _GRID_CAP), 256, out, w.data, w.scale, N, K,
                            bn, bk, s_row, np.int64(s_lead), np.int64(chunks))
        else:
            bn, bk, s_row, s_lead = fp8_scale_args(w)
            self.ctx.launch(self.ctx.kernels.kernel("quant_linear", v, f"qdequant_fp8_{v}"),
                            min(-(-total // 256), _GRID_CAP), 256, out, w.data, w.scale, N, K,
                            bn, bk, s_row, np.int64(s_lead), np.int64(total))
        return out

    def _scratch_array(self, slot: int, shape: tuple[int, ...], dtype: Any) -> DeviceArray:
        """Dequantization buffer ``slot`` viewed as ``shape``/``dtype``; grown (never freed:
        captured graphs keep pointing at older ones) outside graph capture."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        bufs = self._scratch.setdefault(slot, [])
        if not bufs or bufs[-1].nbytes < nbytes:
            require_eager(self.ctx.backend, "quantized weight scratch")
            bufs.append(self.ctx.backend.empty((nbytes,), np.uint8))
        return DeviceArray(bufs[-1].ptr, shape, dtype, bufs[-1])

    def linear_act_and_mul(self, x: DeviceArray, weight: QuantizedWeight,
                           bias: DeviceArray | None = None, activation: str = "silu"):
        """``act(x @ Wg.T + bg) * (x @ Wu.T + bu)`` for a quantized ``[Wg; Wu]``."""
        if activation not in ("silu", "gelu_tanh", "gelu_pytorch_tanh"):
            raise ValueError(f"linear_act_and_mul: unsupported activation {activation!r}; "
                             "use silu or gelu_tanh")
        if weight.shape[-2] % 2:
            raise ValueError(f"linear_act_and_mul: weight has {weight.shape[-2]} rows; gate "
                             "and up need an even count")
        gate_up = self.linear(x, weight, bias)
        ops = self.ctx.ops
        return ops.silu_and_mul(gate_up) if activation == "silu" else ops.gelu_tanh_and_mul(gate_up)

    def rms_norm_linear(self, x, residual, norm_weight, eps, weight, bias=None,
                        zero_centered=False, activation=None):
        """``linear(rms_norm(x, norm_weight, eps, residual), weight, bias)`` (then the
        activation's ``act_and_mul`` when given). 1-:data:`SKINNY_NORM_ROWS` rows the skinny
        kernel takes: one launch
        whose every block normalises the rows itself (the norm prologue of ``gemv_norm.cu``;
        the standalone ``rms_norm`` of one row cost ~5 us a launch, two a layer); else the
        unfused definition."""
        K = x.shape[-1]
        M = x.size // K if K else 0
        if activation not in (None, "silu", "gelu_tanh", "gelu_pytorch_tanh"):
            raise ValueError(f"rms_norm_linear: unsupported activation {activation!r}; "
                             "use None, silu or gelu_tanh")
        if (0 < M <= SKINNY_NORM_ROWS and self.ctx.policy.quant_kernel != "legacy"
                and skinny_servable(x, weight) and norm_weight.dtype == x.dtype
                and M * K * x.dtype.itemsize <= SKINNY_NORM_XS
                and all(a is None or a.ptr % 16 == 0 for a in (x, residual, norm_weight))
                and not weight.lead and weight.shape[-1] == K):
            N = weight.shape[-2]
            r = self.ctx.out(x.shape, x.dtype) if residual is not None else None
            y = self.ctx.out((*x.shape[:-1], N), x.dtype)
            self.skinny(y, x, weight, bias, M, N, K,
                        norm=(r, residual, norm_weight, float(eps), int(zero_centered)))
            if activation is not None:
                ops = self.ctx.ops
                y = ops.silu_and_mul(y) if activation == "silu" else ops.gelu_tanh_and_mul(y)
            return y, (r if residual is not None else x)
        return compose_rms_norm_linear(self.ctx.ops, x, residual, norm_weight, eps, weight,
                                       bias, zero_centered, activation)

    def fill_random(self, array: DeviceArray, seed: int, std: float, mean: float = 0.0) -> None:
        """Random codes for a one-byte array: FP8 values of ``mean`` / ``std`` (uniform,
        saturating), or uniform bytes for anything else (NVFP4 data)."""
        if not array.size:
            return
        seed = np.uint64(seed & (2**64 - 1))
        grid = min(-(-array.size // 256), 1 << 16)
        lib = self.ctx.kernels
        if array.dtype.name.startswith("float8"):
            lib.launch(lib.kernel("quant_linear", "bf16", "qfill_fp8"), grid, 256, array,
                       np.int64(array.size), seed, float(mean), float(std))
        else:
            lib.launch(lib.kernel("quant_linear", "bf16", "qfill_bytes"), grid, 256, array,
                       np.int64(array.size), seed)
