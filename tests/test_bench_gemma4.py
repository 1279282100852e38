"""The Gemma-4 bench shapes have the released models' sizes (needs atlas-gemma4)."""

import pytest

from atlas_core.bench.shapes import shape_config, step_bytes
from atlas_core.plugins import Registry


@pytest.fixture(scope="module")
def loader():
    registry = Registry()
    if "Gemma4ForCausalLM" not in registry.names("weight_loaders"):
        pytest.skip("atlas-gemma4 is not installed: pip install --no-deps -e plugins/atlas-gemma4")
    return registry.create("weight_loaders", "Gemma4ForCausalLM", registry=registry)


@pytest.mark.parametrize("shape,billions", [("gemma-4-31b", (30.0, 31.5)),
                                            ("gemma-4-26b-a4b", (24.5, 26.5))])
def test_gemma4_shapes_have_the_released_sizes(loader, shape, billions):
    low, high = billions
    assert low * 1e9 < loader.parameter_count(shape_config(shape)) < high * 1e9


def test_the_moe_floor_counts_active_experts_and_the_dense_mlp():
    config = shape_config("gemma-4-26b-a4b")
    active = step_bytes(config, 0) / 2
    assert 3.5e9 < active < 4.5e9
    no_dense = {**config, "enable_moe_block": False}
    assert step_bytes(config, 0) - step_bytes(no_dense, 0) == 2 * 30 * 3 * 2816 * 2112


def test_the_engines_step_bytes_count_only_the_experts_a_batch_touches(loader):
    # The H200 bench of gemma-4-26b-a4b printed 215% of floor at batch 1: the engine's count
    # (StepBytes) took every one of the 128 experts as read, as the decoder block that holds the
    # expert stacks did not say its top-k.
    from atlas_core.bench.random_model import build_random_model
    from atlas_core.engine import EngineArgs, LLMEngine
    from atlas_core.engine.step_timing import StepBytes

    config = {**shape_config("gemma-4-26b-a4b"), "hidden_size": 64, "intermediate_size": 48,
              "num_hidden_layers": 6, "num_attention_heads": 2, "num_key_value_heads": 1,
              "num_global_key_value_heads": 1, "head_dim": 16, "global_head_dim": 32,
              "vocab_size": 512, "num_experts": 16, "top_k_experts": 2,
              "moe_intermediate_size": 8, "sliding_window": 32, "max_position_embeddings": 512,
              "layer_types": (["sliding_attention"] * 5 + ["full_attention"])}
    registry = Registry()
    backend = registry.create("gpu_backends", "numpy")
    model = build_random_model(config, backend, registry, dtype="bfloat16")
    engine = LLMEngine(model, backend, EngineArgs(max_num_seqs=4, max_prefill_tokens=128,
                                                  max_seq_len=256, enable_prefix_caching=False))
    count = StepBytes(engine.model, engine.kv_config)
    assert count.experts and all(k == 2 for _, _, k in count.experts)
    # the config arithmetic leaves out norms, routers and scales: compare what batch adds
    for batch in (3, 16):
        assert count(batch, 0) - count(1, 0) == step_bytes(config, 0, batch) - step_bytes(config, 0, 1)
    assert count(1, 0) == pytest.approx(step_bytes(config, 0, 1), rel=0.05)
