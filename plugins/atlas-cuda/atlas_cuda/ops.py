"""The cuda backend's dense-transformer op class and :func:`build_op_table`, the op table of a
backend built from the registered ops (NVRTC kernels, same signatures as the references)."""

from __future__ import annotations

import numpy as np

from atlas_core.api import OpRegistry, OpTable
from atlas_cuda.array import DeviceArray
from atlas_cuda.context import OpContext, need_vec
from atlas_cuda.kernels_loader import variant_of
from atlas_cuda.ops_gemv import GemvOps, gemv_rows
from atlas_cuda.ops_quant import QuantOps, QuantizedWeight, launch_skinny

#: (max M, BM, BN, threads, stages) of the tensor-core GEMM tiles, smallest first.
GEMM_TILES = ((32, 32, 64, 128, 4), (128, 64, 128, 256, 3), (1 << 62, 128, 128, 256, 3))
#: Rows up to which policy ``gemm=skinny`` serves a bf16 / f16 linear with ``qskinny_dense_*``
#: (quant_skinny.cu over weights in the activation dtype: 16 weight rows a warp as the mma A
#: operand, 8 rows of x an n-tile, so 1-8 rows cost one weight read). Its forms and depths are
#: the ``"dense"`` entries of ``ops_quant.SKINNY_DEPTH`` / ``SKINNY2_CONFIG``.
DENSE_SKINNY_MAX_M = 32


def dense_skinny_servable(x: DeviceArray, weight: DeviceArray) -> bool:
    """Whether ``qskinny_dense_*`` takes ``x @ weight.T``: bf16 / f16 both, one ``[N, K]``
    matrix, ``K`` a multiple of 128, 16-byte aligned."""
    return (x.dtype.itemsize == 2 and weight.dtype == x.dtype and len(weight.shape) == 2
            and weight.shape[1] % 128 == 0 and x.ptr % 16 == 0 and weight.ptr % 16 == 0)


def _threads(n: int, cap: int) -> int:
    """``n`` rounded up to whole warps, between 32 and ``cap``."""
    return min(cap, max(32, -(-n // 32) * 32))


class DenseOps:
    """Dense-transformer ops: embedding, norms, ``linear``, elementwise; outputs come from the
    context's step workspace.

    Args:
        ctx: the backend's :class:`~atlas_cuda.context.OpContext`.
    """

    def __init__(self, ctx: OpContext) -> None:
        self.ctx = ctx
        self.gemv = ctx.bind(GemvOps)

    def embedding(self, ids: DeviceArray, table: DeviceArray) -> DeviceArray:
        hidden = table.shape[-1]
        out = self.ctx.out((*ids.shape, hidden), table.dtype)
        if ids.size:
            vec = hidden % 8 == 0 and table.ptr % 16 == 0 and table.dtype.itemsize <= 4
            name = "embedding" if vec else "embedding_scalar"
            threads = _threads(-(-hidden // 8) if vec else hidden, 256)
            self.ctx.launch(self.ctx.kernel("elementwise", table.dtype, name), ids.size, threads,
                            out, ids, table, hidden, pdl=self.ctx.pdl)
        return out

    def rms_norm(self, x: DeviceArray, weight: DeviceArray, eps: float,
                 residual: DeviceArray | None = None, *, zero_centered: bool = False):
        hidden = x.shape[-1]
        need_vec("rms_norm", x, weight, residual, last=hidden)
        if hidden > 512 * 32:
            raise ValueError(f"rms_norm: hidden size {hidden} is above the kernel limit 16384")
        y = self.ctx.out(x.shape, x.dtype)
        r = self.ctx.out(x.shape, x.dtype) if residual is not None else None
        rows = x.size // hidden
        threads = _threads(-(-hidden // 32), 512)
        if rows:
            self.ctx.launch(self.ctx.kernel("elementwise", x.dtype, "rms_norm"), rows, threads,
                            y, r, x, residual, weight, float(eps), hidden, int(zero_centered),
                            pdl=self.ctx.pdl)
        return (y, r) if residual is not None else y

    def linear(self, x: DeviceArray, weight: DeviceArray, bias: DeviceArray | None = None):
        if isinstance(weight, QuantizedWeight):
            return self.ctx.bind(QuantOps).linear(x, weight, bias)
        K, N = x.shape[-1], weight.shape[0]
        M = x.size // K if K else 0
        y = self.ctx.out((*x.shape[:-1], N), x.dtype)
        if M == 0:
            return y
        v = variant_of(x.dtype)
        if K % 8 or x.ptr % 16 or weight.ptr % 16:
            self.ctx.launch(self.ctx.kernel("linear", x.dtype, "linear_scalar"),
                            -(-M * N // 8), 256, y, x, weight, bias, M, N, K)
            return y
        if M <= gemv_rows(self.ctx.policy) or v == "f32":
            self.gemv.gemv(y, x, weight, bias, M, N, K)
            return y
        if (self.ctx.policy.gemm == "skinny" and M <= DENSE_SKINNY_MAX_M
                and dense_skinny_servable(x, weight)):
            launch_skinny(self.ctx, "dense", y, x, weight, (), (), bias, M, N, K)
            return y
        lt = self.ctx.cublaslt()
        # policy gemm_tune: a decode graph's shape timed on these operands, in the eager call
        # that precedes its capture (never in a served eager step, never under capture)
        tune = self.ctx.policy.gemm_tune and self.ctx.backend.probing
        if lt is not None and lt(y, x, weight, bias, M, N, K, tune):
            return y
        _, bm, bn, threads, stages = next(t for t in GEMM_TILES if M <= t[0])
        shmem = stages * (bm + bn) * 40 * x.dtype.itemsize
        k = self.ctx.kernels.kernel("linear", v, f"gemm_{v}_{bm}x{bn}", shmem)
        self.ctx.launch(k, (-(-N // bn), -(-M // bm)), threads, y, x, weight, bias, M, N, K,
                        shmem=shmem)
        return y

    def add(self, a: DeviceArray, b: DeviceArray) -> DeviceArray:
        if a.size != b.size:
            raise ValueError(f"add: sizes differ ({a.shape} vs {b.shape})")
        out = self.ctx.out(a.shape, a.dtype)
        if a.dtype == b.dtype:
            k = self.ctx.kernel("elementwise", a.dtype, "add")
        elif a.dtype == np.float32:
            k = self.ctx.kernel("elementwise", b.dtype, "add_f32")
        else:
            raise TypeError(f"add: unsupported dtype pair {a.dtype} + {b.dtype}")
        if a.size:
            self.ctx.launch(k, min(-(-a.size // 256), 8192), 256, out, a, b, np.int64(a.size),
                            pdl=self.ctx.pdl)
        return out

    def _act_and_mul(self, x: DeviceArray, name: str) -> DeviceArray:
        d = x.shape[-1] // 2
        rows = x.size // (2 * d) if d else 0
        out = self.ctx.out((*x.shape[:-1], d), x.dtype)
        if rows and (d % 8 or x.ptr % 16):
            self.ctx.launch(self.ctx.kernel("elementwise", x.dtype, f"{name}_scalar"),
                            min(-(-out.size // 256), 8192), 256, out, x, d, np.int64(out.size),
                            pdl=self.ctx.pdl)
        elif rows:
            self.ctx.launch(self.ctx.kernel("elementwise", x.dtype, name),
                            (-(-d // 1024), rows), 128, out, x, d, pdl=self.ctx.pdl)
        return out

    def silu_and_mul(self, x: DeviceArray) -> DeviceArray:
        return self._act_and_mul(x, "silu_and_mul")

    def gelu_tanh_and_mul(self, x: DeviceArray) -> DeviceArray:
        return self._act_and_mul(x, "gelu_tanh_and_mul")

    def sigmoid_mul(self, x: DeviceArray, gate: DeviceArray) -> DeviceArray:
        """``x * sigmoid(gate)`` (``sigmoid_mul.cu``); ``gate`` ``[rows, d]`` or ``[rows, 1]``."""
        if gate.dtype != x.dtype:
            raise TypeError(f"sigmoid_mul: expected every array in {x.dtype}, got {gate.dtype}")
        d, width = x.shape[-1], gate.shape[-1]
        if width not in (d, 1) or gate.size != (x.size // d if d else 0) * width:
            raise ValueError(f"sigmoid_mul: gate {gate.shape} must be [rows, {d}] or [rows, 1] "
                             f"for x {x.shape}")
        out = self.ctx.out(x.shape, x.dtype)
        if x.size:
            self.ctx.launch(self.ctx.kernel("sigmoid_mul", x.dtype, "sigmoid_mul"),
                            min(-(-x.size // 256), 8192), 256, out, x, gate, d, width,
                            np.int64(x.size))
        return out

    def linear_act_and_mul(self, x: DeviceArray, weight: DeviceArray,
                           bias: DeviceArray | None = None, activation: str = "silu"):
        """``act(x @ Wg.T + bg) * (x @ Wu.T + bu)`` for ``weight = [Wg; Wu]`` ``[2d, K]``; see
        :func:`atlas_core.ops.norm.linear_act_and_mul`: ``linear`` then the gated activation
        (the one-kernel GEMV of ``gemv_fused.cu`` gained nothing and was removed)."""
        if isinstance(weight, QuantizedWeight):
            return self.ctx.bind(QuantOps).linear_act_and_mul(x, weight, bias, activation)
        if activation not in ("silu", "gelu_tanh", "gelu_pytorch_tanh"):
            raise ValueError(f"linear_act_and_mul: unsupported activation {activation!r}; "
                             "use silu or gelu_tanh")
        if weight.shape[0] % 2:
            raise ValueError(f"linear_act_and_mul: weight has {weight.shape[0]} rows; gate and "
                             "up need an even count")
        gate_up = self.linear(x, weight, bias)
        return self._act_and_mul(gate_up, "silu_and_mul" if activation == "silu"
                                 else "gelu_tanh_and_mul")


def build_op_table(ctx: OpContext, op_registry: OpRegistry) -> OpTable:
    """The op table of one cuda backend, from what the plugins registered (``register_ops``):
    each op's ``"cuda"`` implementation (``"pkg.module:Class.method"``, atlas-cuda's own in
    :mod:`atlas_cuda.plugin`, a model family's in its plugin) bound to the one instance of its
    class on ``ctx`` (:meth:`~atlas_cuda.context.OpContext.bind`), else the op's unfused
    definition over the same table. The table holds the bound methods themselves; ``ctx.ops``
    becomes it (unfused fallbacks call other ops through it).
    """
    table = op_registry.build_table("cuda", bind=ctx.bind)
    ctx.ops = table
    return table
