"""Atlas plugin: DeepSeek-V3 architecture (entry point ``deepseek`` in group ``atlas``): the
multi-head latent attention layer kind ``mla_attention`` and its ops, shared with atlas-mistral."""
