"""Registers the Mistral-4 and Mistral-3 (multimodal wrapper, text model) weight loaders. The
MLA layers are atlas-deepseek's kinds (``mla_attention``, ``deepseek_moe``), the dense ones
core's, looked up in the registry; importing this is free."""

from atlas_core.api import registers

LOADERS = {"Mistral4ForCausalLM": "atlas_mistral.loader:Mistral4Loader",
           "Mistral3ForConditionalGeneration": "atlas_mistral.mistral3:Mistral3Loader"}

register_weight_loaders = registers(LOADERS)
