"""Decode quantized linears for ncu (#22): qwen3-8b's o (4096x4096) and gate_up (24576x4096)
projections at 1 and 8 rows, FP8 block and NVFP4 through the default kernel, and the bf16
dense GEMV of the same shapes for comparison; each launch once after a warm-up.
  ncu --kernel-name regex:"qskinny|gemvn" --launch-skip 12 \\
      --section SpeedOfLight --section Occupancy --section WarpStateStats \\
      python3 scripts/quant_profile.py"""
import numpy as np

from atlas_core.api import bfloat16
from atlas_cuda.backend import CudaBackend
from atlas_cuda.policy import KernelPolicy

from quant_skinny_bench import device_weight  # noqa: E402  (scripts/ on sys.path)

be = CudaBackend(workspace_bytes=64 << 20, policy=KernelPolicy(quant_weights=True))
rng = np.random.default_rng(0)
cases = []
for n, k in ((4096, 4096), (24576, 4096)):
    dense = be.empty((n, k), bfloat16)
    be.fill_random(dense, 1, k ** -0.5)
    for w in (device_weight(be, "fp8_block", n, k, 2), device_weight(be, "nvfp4", n, k, 3), dense):
        for m in (1, 8):
            cases.append((be.from_host(rng.standard_normal((m, k)).astype(bfloat16)), w))
for _ in range(2):  # the first pass compiles and warms; ncu skips its launches
    for x, w in cases:
        be.ops.linear(x, w)
    be.synchronize()
print("done", len(cases), "launches a pass")
