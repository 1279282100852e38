"""Shared fixtures: the plugin registry with atlas-deepseek's loader and layer kinds."""

from __future__ import annotations

import pytest

from atlas_core.api import Registry, make_plugin_manager


@pytest.fixture(scope="session")
def registry():
    reg = Registry(make_plugin_manager(allow=["deepseek"]))
    if "DeepseekV3ForCausalLM" not in reg.names("weight_loaders"):
        pytest.skip("atlas-deepseek is not installed: "
                    "pip install --no-deps -e plugins/atlas-deepseek")
    return reg
