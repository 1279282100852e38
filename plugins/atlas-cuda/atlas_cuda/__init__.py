"""Atlas CUDA backend: device memory, streams, graphs, NVRTC-compiled kernels.

Importing this package touches no GPU; :class:`atlas_cuda.backend.CudaBackend` does when built.
"""

__version__ = "0.1.0"
