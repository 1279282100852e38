"""NVFP4 linears on the block-scaled FP4 tensor cores of targets that have them (GB10:
``kernels/gb10/common/nvfp4_mma.cu``, built for ``sm_121a`` by its ``HARDWARE.toml``
``[module_arch]``), switched on by the target's ``[quant] fp4_mma``. Activations are quantized
to NVFP4 on the fly (W4A4: per-16 ue4m3 group scales under a per-row f32 scale), so results
differ from the W4A16 reference by the activation rounding. Compile-checked, not run
(docs/quantization.md)."""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_cuda.array import DeviceArray
from atlas_cuda.kernels_loader import variant_of
from atlas_cuda.memory import require_eager

#: K granularity of the MMA (one slab: 64 E2M1 values, four group scales).
SLAB = 64


def fp4_mma_enabled(ctx: Any) -> bool:
    """Whether this backend's target runs NVFP4 prefill on the FP4 MMA (``[quant] fp4_mma``
    and ``[module_arch] nvfp4_mma`` in its HARDWARE.toml)."""
    target = getattr(ctx.kernels, "target", None)
    hw = getattr(target, "hardware", None) or {}
    return bool(hw.get("quant", {}).get("fp4_mma")) and "nvfp4_mma" in hw.get("module_arch", {})


def fp4_mma_servable(x: Any, w: Any) -> bool:
    """NVFP4, one matrix, K a multiple of :data:`SLAB`, 16-bit activations."""
    return (w.format == "nvfp4" and not w.lead and w.shape[-1] % SLAB == 0
            and x.dtype.itemsize == 2)


class Fp4Mma:
    """The FP4 MMA path of :class:`~atlas_cuda.ops_quant.QuantOps`: swizzles each weight's
    scales once (cached by weight, first call outside graph capture) and runs the activation
    quantization then the GEMM."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self._scales: dict[int, tuple[Any, DeviceArray]] = {}

    def swizzled_scales(self, w: Any) -> DeviceArray:
        """``uint32 [K/64, N]``: the MMA's scale layout of ``w`` (atlas_gb10.nvfp4_layout)."""
        hit = self._scales.get(id(w))
        if hit is not None:
            return hit[1]
        n, k = w.shape
        require_eager(self.ctx.backend, "NVFP4 scale swizzle")
        out = self.ctx.backend.empty((k // SLAB, n), np.uint32)
        lib = self.ctx.kernels
        lib.launch(lib.kernel("nvfp4_mma", "bf16", "nvfp4_swizzle_scales"),
                   min(-(-out.size // 256), 1 << 15), 256, out, w.scale, n, k // 16)
        self._scales[id(w)] = (w, out)
        return out

    def linear(self, x: DeviceArray, w: Any, bias: DeviceArray | None) -> DeviceArray:
        """``x @ dequantize(w).T + bias`` with x rounded to NVFP4 first."""
        n, k = w.shape
        m = x.size // k
        ctx = self.ctx
        v = variant_of(x.dtype)
        y = ctx.out((*x.shape[:-1], n), x.dtype)
        if not m:
            return y
        ws = self.swizzled_scales(w)
        xq = ctx.out((m, k // 8), np.uint32)
        xs = ctx.out((k // SLAB, m), np.uint32)
        xg = ctx.out((m,), np.float32)
        ctx.launch(ctx.kernels.kernel("nvfp4_mma", v, f"nvfp4_act_quant_{v}"), m, 256, xq, xs, xg,
                   x, m, k)
        ctx.launch(ctx.kernels.kernel("nvfp4_mma", v, f"nvfp4_gemm_{v}"),
                   (-(-n // 32), -(-m // 16)), 128, y, xq, xs, xg, w.data, ws, w.global_scale,
                   bias, m, n, k, pdl=ctx.pdl)
        return y
