"""atlas_core.backends."""
