"""atlas_core.engine."""
