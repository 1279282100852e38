"""The NemotronHForCausalLM loader: the block layout from ``layers_block_type`` or
``hybrid_override_pattern``, released (``backbone.``, per-expert) and in-memory HF (``model.``,
stacked experts) tensor names, and clear errors for configs it cannot serve."""

from __future__ import annotations

import json

import numpy as np
import pytest
from nemotron_checkpoints import prompt, save_model_prefixed

from atlas_core.api import Checkpoint, load_model, write_safetensors
from atlas_core.testing.checkpoints import tiny_config, write_tiny_checkpoint
from atlas_core.testing.forward import ForwardRunner

ARCH = "NemotronHForCausalLM"


@pytest.fixture(scope="module")
def loader(registry):
    return registry.create("weight_loaders", ARCH, registry=registry)


@pytest.fixture(scope="module")
def tiny(registry, tmp_path_factory):
    return write_tiny_checkpoint(ARCH, tmp_path_factory.mktemp("tiny"), registry=registry)


def _logits(path, registry):
    model = load_model(path, "numpy", registry=registry)
    return ForwardRunner(model, model.backend).step([prompt(1, 20)], all_logits=True)[0]


def test_pattern_and_block_type_list_give_the_same_model(loader, registry):
    config = tiny_config(ARCH, registry)
    listed = loader.resolve_config(config)["layer_types"]
    pattern = {k: v for k, v in config.items() if k != "layers_block_type"}
    pattern["hybrid_override_pattern"] = "ME*M-M"
    assert loader.resolve_config(pattern)["layer_types"] == listed
    hf_names = dict(config, layers_block_type=["linear_attention", "moe", "full_attention",
                                               "linear_attention", "mlp", "linear_attention"])
    assert loader.resolve_config(hf_names)["layer_types"] == listed
    assert loader.checkpoint_tensors(pattern) == loader.checkpoint_tensors(config)
    assert loader.resolve_config(pattern)["num_hidden_layers"] == 6


def test_model_prefix_and_stacked_experts_load_the_same_weights(tiny, registry, tmp_path):
    out = save_model_prefixed(tiny, tmp_path / "hf_names")
    assert np.array_equal(_logits(out, registry), _logits(tiny, registry))


def test_transformers_infinity_encoding_and_legacy_field_names(loader, registry):
    config = tiny_config(ARCH, registry)
    config["time_step_limit"] = [0.001, {"__float__": "Infinity"}]
    mixer = loader.build(config).layers[0].mixer
    assert (mixer.dt_min, mixer.dt_max) == (0.001, float("inf"))
    legacy = {k: v for k, v in tiny_config(ARCH, registry).items() if k != "chunk_size"}
    legacy.update(mamba_chunk_size=32, mamba_d_conv=3)
    mixer = loader.build(legacy).layers[0].mixer
    assert (mixer.chunk_size, mixer.kernel_size) == (32, 3)


@pytest.mark.parametrize("change,message", [
    ({"layers_block_type": ["mamba", "cross"]}, "unknown block kinds ['cross']"),
    ({"layers_block_type": None}, "gives no block layout"),
    ({"mamba_num_heads": 0}, "'mamba_num_heads' must be a positive integer"),
    ({"n_groups": 3}, "must be a multiple of n_groups"),
    ({"mlp_hidden_act": "silu"}, "'mlp_hidden_act' 'silu' is not supported"),
    ({"n_group": 3}, "n_group (3) must divide n_routed_experts"),
])
def test_bad_configs_are_refused_naming_the_field(loader, registry, change, message):
    config = {**tiny_config(ARCH, registry), **change}
    with pytest.raises(ValueError) as err:
        loader.build(config)
    assert message in str(err.value)


def test_mtp_tensors_are_skipped(tiny, registry, tmp_path, caplog):
    ckpt = Checkpoint.open(tiny)
    tensors = {n: np.array(ckpt.get(n)) for n in ckpt.names()}
    tensors["mtp.layers.0.norm.weight"] = np.ones(64, np.float32)
    out = tmp_path / "mtp"
    out.mkdir()
    write_safetensors(out / "model.safetensors", tensors, {"format": "pt"})
    config = json.loads((tiny / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config))
    with caplog.at_level("INFO"):
        load_model(out, "numpy", registry=registry)
    assert "not loading 1 multi-token-prediction" in caplog.text
