"""DeepseekV3ForCausalLM's loader without HF: config fields it refuses (with the field named),
the blocks it builds (dense first, then MoE with the latent cache spec), HF's defaults for
absent fields, and the softmax scale with yarn's mscale."""

from __future__ import annotations

import math

import pytest

from atlas_core.api import LatentCacheSpec
from atlas_deepseek.loader import DeepseekV3Loader
from atlas_deepseek.mla import mla_softmax_scale
from atlas_deepseek.moe import DeepseekMoE


@pytest.fixture
def loader(registry):
    return registry.create("weight_loaders", "DeepseekV3ForCausalLM", registry=registry)


@pytest.mark.parametrize("field,value", [("scoring_func", "softmax"), ("topk_method", "greedy"),
                                         ("kv_lora_rank", 0), ("q_lora_rank", -1),
                                         ("n_group", 3), ("num_experts_per_tok", 7)])
def test_unsupported_fields_are_refused_by_name(loader, field, value):
    config = {**loader.tiny_config(), field: value}
    with pytest.raises(ValueError, match=field):
        loader.build(config)


def test_blocks_dense_first_then_moe_with_one_latent_pool(loader):
    model = loader.build(loader.tiny_config())
    ffns = [type(layer.ffn).__name__ for layer in model.layers]
    assert ffns == ["GatedMLP", "DeepseekMoE", "DeepseekMoE"]
    assert model.kv_cache_specs() == [LatentCacheSpec.of(32, 8)] * 3
    assert isinstance(model.layers[1].ffn, DeepseekMoE) and model.layers[1].ffn.has_bias


def test_absent_fields_take_hf_defaults():
    config = DeepseekV3Loader().resolve_config({"hidden_size": 7168, "num_hidden_layers": 61,
                                                "num_attention_heads": 128, "vocab_size": 129280})
    assert (config["kv_lora_rank"], config["q_lora_rank"], config["qk_rope_head_dim"]) == (
        512, 1536, 64)
    assert (config["num_experts"], config["n_group"], config["topk_group"]) == (256, 8, 4)
    assert config["first_k_dense_replace"] == 3 and config["routed_scaling_factor"] == 2.5


def test_softmax_scale_takes_yarn_mscale_squared():
    rope = {"rope_type": "yarn", "factor": 40.0, "mscale_all_dim": 1.0}
    mscale = 0.1 * math.log(40.0) + 1.0
    assert mla_softmax_scale(192, rope) == pytest.approx(192 ** -0.5 * mscale ** 2)
    assert mla_softmax_scale(192, {"rope_type": "default"}) == 192 ** -0.5
