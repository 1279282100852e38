"""A planted out-of-bounds access for compute-sanitizer: proves memcheck sees kernels launched
through atlas_cuda (NVRTC cubins, cuda.core launches). ``gpu_check.sh sanitize`` runs it under
memcheck and expects errors; run alone it exits 0 (the overrun stays inside the allocation's
padding, which is why only the sanitizer can see it)."""

import numpy as np

from atlas_cuda.backend import CudaBackend

be = CudaBackend()
a, b, out = (be.zeros((256,), np.float32) for _ in range(3))
kernel = be.kernels.kernel("elementwise", "f32", "add_f32")
be.kernels.launch(kernel, 4, 256, out, a, b, np.int64(1024))  # 1,024 elements into 256
be.synchronize()
print("canary launched: 768 elements written past a 256-element allocation")
