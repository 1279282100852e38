"""atlas_core.comm."""
