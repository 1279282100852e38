"""Registers the ``cuda`` GPU backend (lazily: nothing here imports cuda-python)."""

from atlas_core.hookspecs import hookimpl


@hookimpl
def register_gpu_backends(register):
    register("cuda", "atlas_cuda.backend:CudaBackend")
