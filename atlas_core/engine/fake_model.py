"""Moved: the engine test fake lives in :mod:`atlas_core.testing.fake_model` with the other fakes.

Kept so existing imports keep working; import from ``atlas_core.testing.fake_model``.
"""

from atlas_core.testing.fake_model import FakeCausalLM, make_fake_engine, run_to_completion, scripted

__all__ = ["FakeCausalLM", "make_fake_engine", "run_to_completion", "scripted"]
