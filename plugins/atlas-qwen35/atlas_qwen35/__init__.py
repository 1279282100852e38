"""Atlas plugin: Qwen3-Next and Qwen3.5 / Qwen3.6 hybrid Gated DeltaNet models (entry point ``qwen35``)."""
