"""Registers the ``cuda`` GPU backend and its implementations of the core ops (lazily: nothing
here imports cuda-python; the classes are imported when a cuda backend builds its op table)."""

from atlas_core.api import hookimpl

#: Op class (constructed once per backend with its ``OpContext``) -> the core ops it implements.
#: Ops not listed run their unfused definition over the table (none today).
CUDA_OPS = {
    "atlas_cuda.ops:DenseOps": (
        "embedding", "rms_norm", "linear", "linear_act_and_mul", "add", "silu_and_mul",
        "gelu_tanh_and_mul", "sigmoid_mul"),
    "atlas_cuda.ops_gemv:GemvOps": ("rms_norm_linear",),
    "atlas_cuda.ops_attention:AttentionOps": (
        "rotary_embedding", "reshape_and_cache", "qk_norm_rope_and_cache",
        "rope_cache_attention", "paged_attention", "prefill_attention"),
    "atlas_cuda.ops_moe:MoeOps": ("moe_route", "moe_experts", "moe_block", "rms_norm_moe_block"),
    "atlas_cuda.ops_sampling:SamplingOps": (
        "argmax", "log_softmax", "topk", "apply_penalties", "sample"),
    "atlas_cuda.ops_logits_filters:LogitsFilterOps": (
        "apply_dry", "apply_xtc", "apply_top_n_sigma"),
    "atlas_cuda.ops_guided:GuidedOps": ("apply_token_bitmask",),
    "atlas_cuda.ops_blocks:BlockCopyOps": ("gather_blocks", "scatter_blocks"),
}


@hookimpl
def register_gpu_backends(register):
    register("cuda", "atlas_cuda.backend:CudaBackend")


@hookimpl
def register_ops(register):
    for cls, names in CUDA_OPS.items():
        for name in names:
            register(name, f"{cls}.{name}", backend="cuda")
