"""The ``nemotron-3-nano-30b-a3b`` bench shape, read by the atlas-nemotron-h loader: the
published 52-block layout (23 Mamba-2, 23 MoE, 6 attention), 31.3B parameters, 3.26B active."""

import pytest

from atlas_core.bench.shapes import shape_config
from atlas_core.plugins import Registry

ARCH = "NemotronHForCausalLM"


@pytest.fixture(scope="module")
def loader():
    registry = Registry()
    if ARCH not in registry.names("weight_loaders"):
        pytest.skip("atlas-nemotron-h is not installed: "
                    "pip install --no-deps -e plugins/atlas-nemotron-h")
    return registry.create("weight_loaders", ARCH, registry=registry)


def test_layout_and_parameter_counts(loader):
    config = shape_config("nemotron-3-nano-30b-a3b")
    kinds = loader.resolve_config(config)["layer_types"]
    assert [kinds.count(k) for k in ("mamba", "moe", "attention", "mlp")] == [23, 23, 6, 0]
    total = loader.parameter_count(config)
    idle_experts = 23 * (128 - 6) * 2 * 2688 * 1856
    assert 31.2e9 < total < 31.3e9 and 3.2e9 < total - idle_experts < 3.3e9
