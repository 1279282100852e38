"""Registers this family's layer kinds and weight loaders. Lazy strings: importing this is free."""

from atlas_core.hookspecs import hookimpl

LAYERS = {
    "gated_deltanet": "atlas_qwen35.gated_deltanet:GatedDeltaNet",
    "gated_attention": "atlas_qwen35.gated_attention:GatedAttention",
    "moe_shared_expert": "atlas_qwen35.moe:SharedExpertMoE",
}

LOADERS = {
    "Qwen3NextForCausalLM": "atlas_qwen35.loaders:Qwen3NextLoader",
    "Qwen3_5ForCausalLM": "atlas_qwen35.loaders:Qwen3_5Loader",
    "Qwen3_5MoeForCausalLM": "atlas_qwen35.loaders:Qwen3_5MoeLoader",
    "Qwen3_5ForConditionalGeneration": "atlas_qwen35.loaders:Qwen3_5VLLoader",
    "Qwen3_5MoeForConditionalGeneration": "atlas_qwen35.loaders:Qwen3_5MoeVLLoader",
}


@hookimpl
def register_layers(register):
    for kind, factory in LAYERS.items():
        register(kind, factory)


@hookimpl
def register_weight_loaders(register):
    for architecture, factory in LOADERS.items():
        register(architecture, factory)
