"""atlas_core.model."""
