"""Built-in GPU backends, ``numpy`` (CPU reference) and ``mock`` (records GPU discipline), and
the numpy backend's op implementations (the mock runs the numpy table)."""

from atlas_core.hookspecs import hookimpl

_OPS = "atlas_core.backends.numpy_ops:NumpyOps"

#: Ops the numpy backend implements itself; the others run their unfused definition or reference.
NUMPY_OPS = {
    **{name: f"{_OPS}.{name}" for name in (
        "embedding", "rms_norm", "linear", "linear_act_and_mul", "add", "silu_and_mul",
        "gelu_tanh_and_mul", "moe_experts")},
    **{name: f"atlas_core.backends.numpy_attention:{name}"
       for name in ("prefill_attention", "paged_attention")},
    **{name: f"atlas_core.backends.numpy_sampling:{name}"
       for name in ("argmax", "topk", "apply_penalties", "sample")},
}


@hookimpl
def register_gpu_backends(register):
    register("numpy", "atlas_core.backends.numpy_backend:NumpyBackend")
    register("mock", "atlas_core.backends.mock_backend:MockGpuBackend")


@hookimpl
def register_ops(register):
    for name, impl in NUMPY_OPS.items():
        register(name, impl, backend="numpy")
