"""Atlas plugin: Qwen3, Qwen3-MoE, Llama and Mistral (entry point ``qwen3`` in group ``atlas``)."""
