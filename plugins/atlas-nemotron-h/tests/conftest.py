"""Shared fixtures: the plugin registry, one HF-saved tiny float32 checkpoint per session, the
numpy backend and, on a machine with a GPU, one cuda backend per session."""

from __future__ import annotations

import pytest

from atlas_core.api import Registry, make_plugin_manager


@pytest.fixture(scope="session")
def registry():
    reg = Registry(make_plugin_manager(allow=["nemotron_h"]))
    if "NemotronHForCausalLM" not in reg.names("weight_loaders"):
        pytest.skip("atlas-nemotron-h is not installed: "
                    "pip install --no-deps -e plugins/atlas-nemotron-h")
    return reg


@pytest.fixture
def backend(registry):
    return registry.create("gpu_backends", "numpy")


@pytest.fixture(scope="session")
def checkpoint(registry, tmp_path_factory):
    pytest.importorskip("transformers")
    from nemotron_checkpoints import save_hf_checkpoint

    return save_hf_checkpoint(tmp_path_factory.mktemp("nemotron_h") / "fp32", registry=registry,
                              template="nano3", max_position_embeddings=2048)


@pytest.fixture(scope="session")
def cuda_backend(registry):
    from nemotron_cuda_probe import HAS_GPU

    if not HAS_GPU:
        pytest.skip("no CUDA device, or atlas-cuda is missing: pip install atlas-nemotron-h[cuda]")
    return Registry().create("gpu_backends", "cuda")
