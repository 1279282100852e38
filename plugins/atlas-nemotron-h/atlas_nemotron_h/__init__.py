"""Atlas model family plugin: Nemotron-H / Nemotron-3 (Mamba-2 hybrid)."""
