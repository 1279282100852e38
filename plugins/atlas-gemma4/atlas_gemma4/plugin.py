"""Registers this family's layer kinds, weight loaders and ops (specs, CUDA implementations and
sources). Lazy strings: importing this imports nothing heavy; the CUDA part
(``atlas-gemma4[cuda]``) is imported only when the cuda backend builds its op table."""

from atlas_core.api import OpSpec, hookimpl, registers, registers_ops

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
#: ``ffn_in`` has an unfused definition (its composition over the backend's ops), so the numpy
#: backend rounds it exactly as the separate ops it replaces.
OPS = tuple(OpSpec(name, f"{_REF}:{name}", cases=f"atlas_gemma4.gemma4_cases:{name}_cases",
                   unfused=f"{_REF}:compose_{name}" if name == "ffn_in" else None)
            for name in ("mul", "softcap", "sliding_window_attention", "ffn_in", "ffn_out",
                         "mul_gathered"))
CUDA_OPS = "atlas_gemma4.cuda.gemma4_ops:Gemma4CudaOps"


register_layers = registers(LAYERS)
register_weight_loaders = registers(LOADERS)
register_ops = registers_ops(OPS, classes={"cuda": CUDA_OPS})


@hookimpl
def register_kernel_sources(register):
    register("gemma4", "atlas_gemma4.cuda:kernel_dir")
