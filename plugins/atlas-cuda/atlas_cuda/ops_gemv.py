"""Decode GEMVs of the cuda backend (at most 8 rows of ``x``): ``linear``'s small-M path and the
fused ``linear_act_and_mul`` (``kernels/cuda/common/linear.cu``, ``gemv_fused.cu``)."""

from __future__ import annotations

from typing import Any

from atlas_cuda import env as cuda_env
from atlas_cuda.array import DeviceArray
from atlas_cuda.kernels_loader import variant_of

#: Largest M served by the GEMV kernels; above it bf16/f16 go to the tensor-core GEMM.
GEMV_MAX_M = 8
#: Output columns per 256-thread GEMV block (a warp per column).
_COLS_PER_BLOCK = 8


def _row_tiles(M: int):
    """``(m0, rows kernel variant)`` for each tile of at most :data:`GEMV_MAX_M` rows."""
    for m0 in range(0, M, GEMV_MAX_M):
        yield m0, next(t for t in (1, 2, 4, 8) if t >= min(M - m0, GEMV_MAX_M))


class GemvOps:
    """Mixed into :class:`atlas_cuda.ops.CudaOps`."""

    def _gemv(self, y: DeviceArray, x: DeviceArray, weight: DeviceArray,
              bias: DeviceArray | None, M: int, N: int, K: int) -> None:
        """``y = x @ weight.T + bias`` for 16-byte aligned operands, K a multiple of 8: a warp
        per output column; ``ATLAS_CUDA_GEMV_CHUNKS`` picks 4 or 8 loads in flight per lane."""
        v = variant_of(x.dtype)
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
