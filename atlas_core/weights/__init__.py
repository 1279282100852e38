"""atlas_core.weights."""
