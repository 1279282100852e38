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
