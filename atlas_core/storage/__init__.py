"""atlas_core.storage."""
