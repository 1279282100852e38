"""Random-weight benches built on the device (no checkpoint), fill_random, hybrid step bytes."""

import json
import math

import numpy as np
import pytest

from atlas_core.bench.random_model import build_random_model, param_scale
from atlas_core.bench.shapes import SHAPES, shape_config, step_bytes
from atlas_core.cli import main
from atlas_core.plugins import Registry


@pytest.fixture(scope="module")
def registry():
    return Registry()


def test_default_fill_random_is_deterministic_and_scaled(registry):
    be = registry.create("gpu_backends", "numpy")
    a, b = be.empty((256, 512), np.float32), be.empty((256, 512), np.float32)
    be.fill_random(a, 7, 0.5, 1.0)
    be.fill_random(b, 7, 0.5, 1.0)
    host = be.to_host(a)
    assert np.array_equal(host, be.to_host(b))
    assert abs(host.mean() - 1.0) < 0.01 and abs(host.std() - 0.5) < 0.01
    be.fill_random(b, 8, 0.5, 1.0)
    assert not np.array_equal(host, be.to_host(b))


def test_param_scales():
    assert param_scale("model.norm.weight", (64,)) == (1.0, 0.05)
    assert param_scale("model.embed_tokens.weight", (10, 64)) == (0.0, 1.0)
    assert param_scale("x.experts.down_proj", (8, 64, 16)) == (0.0, 0.25)


@pytest.mark.parametrize("name", ["tiny-moe", "tiny-qwen3.5-moe"])
def test_step_bytes_counts_every_parameter(registry, name):
    # With every expert in use, a step reads all parameters but the embedding table (one row
    # per sequence); hybrids add their float32 recurrent state, read and written.
    config = shape_config(name)
    model = registry.get("weight_loaders", config["architectures"][0])().build(config)
    total = sum(math.prod(spec.shape) for *_, spec in model.named_specs())
    batch = config["num_experts"]
    h, vocab = config["hidden_size"], config["vocab_size"]
    state = 0
    if "layer_types" in config:
        k, conv = config["linear_conv_kernel_dim"], 2 * 2 * 16 + 4 * 16
        gdn = config["layer_types"].count("linear_attention")
        state = batch * gdn * ((k - 1) * conv + 4 * 16 * 16) * 8
    assert step_bytes(config, 0, batch) == (total - vocab * h + batch * h) * 2 + state


def test_35b_a3b_active_parameters():
    # Qwen3.5-35B-A3B: ~3B parameters active per token (8 of 256 experts + shared expert).
    assert 5.6e9 < step_bytes(SHAPES["qwen3.5-35b-a3b"], 0) < 6.4e9


@pytest.mark.parametrize("name", ["tiny-moe", "tiny-qwen3.5-moe"])
def test_bench_in_memory_writes_nothing(tmp_path, monkeypatch, name):
    monkeypatch.setenv("ATLAS_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", name, "--backend", "numpy", "--prompt-len", "16",
                 "--decode-tokens", "4", "--concurrency", "1,2", "--copy-mb", "1",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [c["batch"] for c in result["cells"]] == [1, 2]
    assert all(c["status"] == "ok" and c["ttft_s"] > 0 for c in result["cells"])
    assert not (tmp_path / "cache" / "bench").exists()


def test_random_model_logits_are_finite(registry):
    be = registry.create("gpu_backends", "numpy")
    model = build_random_model(shape_config("tiny-moe"), be, registry, seed=3)
    embed = be.to_host(model.params["model.embed_tokens.weight"]).astype(np.float32)
    assert np.isfinite(embed).all() and embed.std() > 0.5
