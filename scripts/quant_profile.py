"""One FP8 and one NVFP4 decode GEMV (qwen3-8b's gate_up shape, 1 row) for ncu:
  ncu --kernel-name regex:qgemv --section SpeedOfLight --section ComputeWorkloadAnalysis \
      --section InstructionStats python3 scripts/quant_profile.py"""
import numpy as np

from atlas_core.api import bfloat16, quantize
from atlas_cuda.backend import CudaBackend

be = CudaBackend(workspace_bytes=64 << 20)
rng = np.random.default_rng(0)
n, k = 24576, 4096
for fmt in ("fp8_block", "nvfp4"):
    q = quantize(rng.standard_normal((n, k)).astype(np.float32) * k ** -0.5, fmt, dtype=bfloat16)
    dev = q.replace(**{a: be.from_host(np.asarray(getattr(q, a), order="C"))
                       for a in ("data", "scale", "global_scale") if getattr(q, a) is not None})
    x = be.from_host(rng.standard_normal((1, k)).astype(bfloat16))
    for _ in range(3):
        be.ops.linear(x, dev)
    be.synchronize()
print("done")
