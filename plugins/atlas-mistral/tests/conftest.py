"""Shared fixtures: the plugin registry with atlas-mistral's loader and atlas-deepseek's MLA
layer kinds."""

from __future__ import annotations

import pytest

from atlas_core.api import Registry, make_plugin_manager


@pytest.fixture(scope="session")
def registry():
    reg = Registry(make_plugin_manager(allow=["mistral", "deepseek"]))
    if "Mistral4ForCausalLM" not in reg.names("weight_loaders"):
        pytest.skip("atlas-mistral is not installed: "
                    "pip install --no-deps -e plugins/atlas-mistral")
    return reg
