"""Diagnose the quantized linears on a GPU: host vs device dequantized weights, GEMV / GEMM /
dequantize paths against the NumPy reference, argument types (one line per check)."""
import numpy as np

from atlas_core.api import QuantizedWeight, bfloat16, quantize
from atlas_core.api import reference as ref
from atlas_core.ops.quant import dequantize
from atlas_cuda.backend import CudaBackend
from atlas_cuda.ops_quant import QuantOps, fp8_scale_args, kernel_operands


def rel(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


be = CudaBackend(workspace_bytes=64 << 20)
rng = np.random.default_rng(0)
for fmt in ("fp8_tensor", "fp8_channel", "fp8_block", "nvfp4"):
    for n, k in ((16, 64), (256, 1024)):
        w = rng.standard_normal((n, k)).astype(np.float32) * k ** -0.5
        q = quantize(w, fmt, dtype=bfloat16)
        print(f"== {fmt} {n}x{k}: data {q.data.dtype}{q.data.shape} scale "
              f"{np.asarray(q.scale).dtype}{np.asarray(q.scale).shape} gs {None if q.global_scale is None else np.asarray(q.global_scale).shape} "
              f"shape types {[type(v).__name__ for v in q.shape]} block {q.block_size}")
        dev = q.replace(**{a: be.from_host(np.asarray(getattr(q, a), order="C"))
                           for a in ("data", "scale", "global_scale") if getattr(q, a) is not None})
        back = be.to_host(dev.data)
        print("  data round trip equal:", np.array_equal(back.view(np.uint8), np.asarray(q.data).view(np.uint8)))
        if fmt != "nvfp4":
            print("  scale args", fp8_scale_args(dev), [type(v).__name__ for v in fp8_scale_args(dev)])
        print("  operands", kernel_operands(dev)[0], [type(v).__name__ for v in kernel_operands(dev)[2]])
        qo = be.ctx.bind(QuantOps) if hasattr(be.ctx, "bind") else QuantOps(be.ctx)
        d = be.to_host(qo.dequantize(dev, bfloat16))
        h = dequantize(q)
        print(f"  dequant rel {rel(d, h):.3e}; first 6 dev {np.asarray(d, np.float32).ravel()[:6]} host {h.ravel()[:6]}")
        for m in (1, 3, 9, 64, 80):
            x = rng.standard_normal((m, k)).astype(bfloat16)
            y = be.to_host(be.ops.linear(be.from_host(x), dev))
            want = ref.linear(x, q)
            print(f"  linear m={m}: rel {rel(y, want):.3e}  y[0,:4] {np.asarray(y, np.float32)[0, :4]} want {np.asarray(want, np.float32)[0, :4]}")
        dense = be.to_host(be.ops.linear(be.from_host(x), be.from_host(h.astype(bfloat16))))
        print(f"  dense linear of host-dequantized weight m=80: rel {rel(dense, want):.3e}")
