"""The ``deepseek-v3`` and ``mistral-small-4`` bench shapes: layer counts cut to fit one 80 GB
GPU in bf16, read by their loaders (atlas-deepseek, atlas-mistral) as HF reads them, with the
decode cost of a layer and the latent KV bytes per token."""

import pytest

from atlas_core.bench.shapes import shape_config, step_bytes
from atlas_core.plugins import Registry


def _loader(arch):
    registry = Registry()
    if arch not in registry.names("weight_loaders"):
        pytest.skip(f"{arch}'s plugin is not installed (plugins/atlas-deepseek, atlas-mistral)")
    return registry.create("weight_loaders", arch, registry=registry)


@pytest.mark.parametrize("name,arch,params,full,layers", [
    ("deepseek-v3", "DeepseekV3ForCausalLM", 25.45e9, None, 61),
    ("mistral-small-4", "Mistral4ForCausalLM", 27.27e9, 118.97e9, 36)])
def test_reduced_shapes_fit_one_gpu(name, arch, params, full, layers):
    loader = _loader(arch)
    config = shape_config(name)
    count = loader.parameter_count(config)
    assert abs(count - params) < 0.01e9 and count * 2 < 60e9
    if full is not None:
        assert abs(loader.parameter_count({**config, "num_hidden_layers": layers}) - full) < 0.01e9
    attention = loader.build_layer(loader.resolve_config(config), 0).mixer
    assert attention.scale != (192 if name == "deepseek-v3" else 128) ** -0.5  # yarn mscale


@pytest.mark.parametrize("name,latent,per_layer", [("deepseek-v3", 576, 1.17e9),
                                                   ("mistral-small-4", 320, 0.31e9)])
def test_latent_kv_and_per_layer_decode_cost(name, latent, per_layer):
    config = shape_config(name)
    layers = config["num_hidden_layers"]
    more = {**config, "num_hidden_layers": layers + 1}
    assert abs(step_bytes(more, 1024) - step_bytes(config, 1024) - per_layer) < 0.01e9
    kv = step_bytes(config, 32768, batch=32) - step_bytes(config, 0, batch=32)
    assert kv == 32 * 32768 * layers * latent * 2
