"""atlas_core.server."""
