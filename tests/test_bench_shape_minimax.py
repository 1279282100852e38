"""The ``minimax-m2`` bench shape: 5 of MiniMax-M2's 62 layers, sized to fit one 80 GB GPU in
bf16, read by the atlas-minimax loader the way HF reads it (``rotary_dim`` partial rotary)."""

import pytest

from atlas_core.bench.shapes import shape_config, step_bytes
from atlas_core.plugins import Registry

ARCH = "MiniMaxM2ForCausalLM"


@pytest.fixture(scope="module")
def loader():
    registry = Registry()
    if ARCH not in registry.names("weight_loaders"):
        pytest.skip("atlas-minimax is not installed: pip install --no-deps -e plugins/atlas-minimax")
    return registry.create("weight_loaders", ARCH, registry=registry)


def test_five_layers_fit_one_gpu_and_the_full_model_is_230b(loader):
    config = shape_config("minimax-m2")
    assert loader.rope(config)["partial_rotary_factor"] == 0.5
    five = loader.parameter_count(config)
    assert 19.5e9 < five < 19.7e9 and five * 2 < 40e9
    assert 228e9 < loader.parameter_count({**config, "num_hidden_layers": 62}) < 231e9


def test_per_layer_decode_cost():
    config = shape_config("minimax-m2")
    per_layer = step_bytes({**config, "num_hidden_layers": 6}, 1024) - step_bytes(config, 1024)
    assert 0.30e9 < per_layer < 0.34e9
    batch32 = step_bytes(config, 32768, batch=32)
    assert batch32 < 60e9
