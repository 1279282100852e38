import os, sys
from atlas_cuda.backend import CudaBackend
from atlas_core.ops._dtypes import bfloat16
be = CudaBackend()
n, k = int(sys.argv[1]), int(sys.argv[2])
x = be.empty((1, k), bfloat16); be.fill_random(x, 1, 1.0)
ws = [be.empty((n, k), bfloat16) for _ in range(4)]
for i, w in enumerate(ws): be.fill_random(w, 10 + i, k ** -0.5)
for r in range(3):
    for w in ws: be.ops.linear(x, w)
be.synchronize()
print("ok")
