"""atlas_core.testing."""
