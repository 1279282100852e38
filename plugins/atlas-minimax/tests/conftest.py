"""Shared fixtures: the plugin registry and one HF-saved tiny float32 checkpoint per session."""

from __future__ import annotations

import pytest

from atlas_core.api import Registry, make_plugin_manager


@pytest.fixture(scope="session")
def registry():
    reg = Registry(make_plugin_manager(allow=["minimax"]))
    if "MiniMaxM2ForCausalLM" not in reg.names("weight_loaders"):
        pytest.skip("atlas-minimax is not installed: pip install --no-deps -e plugins/atlas-minimax")
    return reg


@pytest.fixture(scope="session")
def checkpoint(registry, tmp_path_factory):
    pytest.importorskip("transformers")
    from minimax_checkpoints import save_hf_checkpoint

    return save_hf_checkpoint(tmp_path_factory.mktemp("minimax") / "fp32", registry=registry,
                              chat_template=True, max_position_embeddings=2048)
