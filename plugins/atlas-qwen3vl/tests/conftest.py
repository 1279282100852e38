"""Fixtures of the atlas-qwen3vl tests (helpers: :mod:`qwen3vl_checkpoints`)."""

import pytest

from atlas_core.api import Registry, make_plugin_manager


@pytest.fixture(scope="session")
def registry():
    return Registry(make_plugin_manager(allow=["qwen3", "qwen35", "qwen3vl"]))
