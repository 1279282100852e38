"""Registers the weight loaders of this family. Lazy strings: importing this imports nothing heavy."""

from atlas_core.api import registers

LOADERS = {
    "Qwen3ForCausalLM": "atlas_qwen3.loaders:Qwen3Loader",
    "Qwen3MoeForCausalLM": "atlas_qwen3.loaders:Qwen3MoeLoader",
    "LlamaForCausalLM": "atlas_qwen3.loaders:LlamaLoader",
    "MistralForCausalLM": "atlas_qwen3.loaders:MistralLoader",
}

register_weight_loaders = registers(LOADERS)
