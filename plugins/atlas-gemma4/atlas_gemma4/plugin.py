"""Registers this family's layer kinds, weight loaders and ops. Lazy strings: importing this
imports nothing heavy."""

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

#: The ops Gemma-4 adds; the numpy backend runs their references. No cuda implementation yet:
#: the loaders refuse a backend without them, naming the missing ops.
OPS = tuple(OpSpec(name, f"{_REF}:{name}", cases=f"atlas_gemma4.gemma4_cases:{name}_cases")
            for name in ("mul", "softcap", "sliding_window_attention"))


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
