"""Built-in GPU backends: ``numpy`` (CPU reference) and ``mock`` (records GPU discipline)."""

from atlas_core.hookspecs import hookimpl


@hookimpl
def register_gpu_backends(register):
    register("numpy", "atlas_core.backends.numpy_backend:NumpyBackend")
    register("mock", "atlas_core.backends.mock_backend:MockGpuBackend")
