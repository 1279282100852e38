"""atlas-toy: an example model-family plugin for Atlas."""
