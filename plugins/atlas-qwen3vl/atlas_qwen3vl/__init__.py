"""Atlas model family plugin: Qwen3-VL and the Qwen3.5 / Qwen3.6 vision towers."""
