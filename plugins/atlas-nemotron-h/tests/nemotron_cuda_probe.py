"""Whether a CUDA device and the ``atlas-nemotron-h[cuda]`` extra are usable (a uniquely named
module: conftest is not importable)."""

from atlas_core.testing.gpu import cuda_device_available

HAS_GPU = cuda_device_available()
