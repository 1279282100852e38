"""Registers this family's layer kinds, weight loaders and ops (specs, CUDA implementations and
sources). Lazy strings: importing this imports nothing heavy; the CUDA part
(``atlas-gemma4[cuda]``) is imported only when the cuda backend builds its op table."""

from atlas_core.api import OpSpec, hookimpl

LAYERS = {
    "gemma4_attention": "atlas_gemma4.attention:Gemma4Attention",
    "gemma4_decoder": "atlas_gemma4.decoder:Gemma4DecoderLayer",
}

LOADERS = {
    "Gemma4ForCausalLM": "atlas_gemma4.loaders:Gemma4Loader",
    "Gemma4ForConditionalGeneration": "atlas_gemma4.loaders:Gemma4VLLoader",
    "Gemma3ForCausalLM": "atlas_gemma4.gemma3_loaders:Gemma3Loader",
    "Gemma3ForConditionalGeneration": "atlas_gemma4.gemma3_loaders:Gemma3VLLoader",
}

_REF = "atlas_gemma4.ops"

#: The ops Gemma-4 adds; the numpy backend runs their references, the cuda backend the methods
#: of the same name of :data:`CUDA_OPS`. The loaders refuse a backend with neither.
OPS = tuple(OpSpec(name, f"{_REF}:{name}", cases=f"atlas_gemma4.gemma4_cases:{name}_cases")
            for name in ("mul", "softcap", "sliding_window_attention"))
CUDA_OPS = "atlas_gemma4.cuda.gemma4_ops:Gemma4CudaOps"


@hookimpl
def register_layers(register):
    for kind, factory in LAYERS.items():
        register(kind, factory)


@hookimpl
def register_weight_loaders(register):
    for architecture, factory in LOADERS.items():
        register(architecture, factory)


@hookimpl
def register_ops(register):
    for spec in OPS:
        register(spec.name, spec)
        register(spec.name, f"{CUDA_OPS}.{spec.name}", backend="cuda")


@hookimpl
def register_kernel_sources(register):
    register("gemma4", "atlas_gemma4.cuda:kernel_dir")
