"""MiniMaxM2ForCausalLM loader: Atlas-written tiny checkpoints load in Atlas and HF alike, HF's
config defaults, partial rotary from ``rotary_dim``, clear errors for what M2 does not have,
MTP tensors skipped with one log line, the routing op's contract cases, and a backend without
that op refused at load."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from atlas_core.api import Registry, load_model, make_plugin_manager, read_config, resolve
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.contracts_cases import check_case
from atlas_core.testing.forward import ForwardRunner

ARCH = "MiniMaxM2ForCausalLM"


def loader(registry):
    return registry.create("weight_loaders", ARCH, registry=registry)


def test_atlas_written_checkpoint_matches_hf(registry, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = write_tiny_checkpoint(ARCH, tmp_path, registry=registry, seed=2)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert type(hf).__name__ == ARCH
    model = load_model(path, "numpy", registry=registry)
    ids = np.random.default_rng(0).integers(0, 377, 19).tolist()
    got = ForwardRunner(model, model.backend, max_seq_len=32).step([ids], all_logits=True)[0]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5)


def test_absent_fields_mean_hf_defaults(registry):
    transformers = pytest.importorskip("transformers")
    minimal = {"architectures": [ARCH], "hidden_size": 3072, "num_hidden_layers": 62,
               "num_attention_heads": 48, "vocab_size": 200064}
    config = loader(registry).resolve_config(minimal)
    hf = transformers.MiniMaxM2Config(**{k: v for k, v in minimal.items() if k != "architectures"})
    for name, hf_name in (("head_dim", "head_dim"), ("num_key_value_heads", "num_key_value_heads"),
                          ("intermediate_size", "intermediate_size"),
                          ("num_experts", "num_local_experts"),
                          ("num_experts_per_tok", "num_experts_per_tok"),
                          ("max_position_embeddings", "max_position_embeddings"),
                          ("rms_norm_eps", "rms_norm_eps"),
                          ("tie_word_embeddings", "tie_word_embeddings")):
        assert config[name] == getattr(hf, hf_name), name
    assert loader(registry).rope(config)["rope_theta"] == hf.rope_parameters["rope_theta"]


def test_rotary_dim_is_partial_rotary(registry):
    released = {"head_dim": 128, "rotary_dim": 64, "rope_theta": 5000000}
    assert loader(registry).rope(released)["partial_rotary_factor"] == 0.5
    saved = {**released, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                             "partial_rotary_factor": 0.25}}
    assert loader(registry).rope(saved)["partial_rotary_factor"] == 0.25


@pytest.mark.parametrize("overrides,match", [
    ({"scoring_func": "softmax"}, "scoring_func"),
    ({"shared_intermediate_size": 512}, "shared_intermediate_size"),
    ({"attn_type_list": [0, 1, 1]}, "lightning"),
    ({"num_local_experts": 0}, "'num_local_experts' must be a positive integer"),
    ({"attention_bias": True}, "attention_bias"),
])
def test_unsupported_configs_are_refused_clearly(registry, overrides, match):
    config = {**loader(registry).tiny_config(), **overrides}
    with pytest.raises(ValueError, match=match):
        loader(registry).build(config)


def test_mtp_tensors_are_skipped_with_one_log_line(registry, tmp_path, caplog):
    from atlas_core.api import write_safetensors

    path = write_tiny_checkpoint(ARCH, tmp_path, registry=registry, num_mtp_modules=1)
    extra = {"model.layers.3.self_attn.q_proj.weight": np.zeros((64, 64), np.float32),
             "model.layers.3.input_layernorm.weight": np.ones(64, np.float32)}
    write_safetensors(path / "model.safetensors",
                      {**_tensors(path / "model.safetensors"), **extra}, {"format": "pt"})
    with caplog.at_level(logging.INFO, logger="atlas_minimax.loader"):
        model = load_model(path, "numpy", registry=registry)
    lines = [r.getMessage() for r in caplog.records if r.name == "atlas_minimax.loader"]
    assert lines == ["not loading 2 multi-token-prediction (MTP) tensors: Atlas does not use "
                     "MiniMax-M2's MTP modules yet"]
    assert len(model.layers) == read_config(path)["num_hidden_layers"] == 3


def _tensors(file):
    from safetensors.numpy import load_file
    return load_file(str(file))


def test_routing_op_contract_cases_on_numpy(registry):
    backend = registry.create("gpu_backends", "numpy")
    cases = resolve(backend.op_registry.spec("moe_route_biased").cases)()
    assert len(cases) == 26  # 6 shapes x 2 dtypes x renorm or not, and a ties case a dtype
    for case in cases:
        check_case(backend, backend.op_registry, "moe_route_biased", case)


def test_bias_steers_the_choice_not_the_weights():
    from atlas_minimax.routing import moe_route_biased

    logits = np.array([[2.0, 1.0, 0.0, -1.0]], np.float32)
    weights, ids = moe_route_biased(logits, np.array([0, 0, 0, 5.0], np.float32), 2, False)
    sig = 1 / (1 + np.exp(-logits[0]))
    assert ids.tolist() == [[3, 0]]
    np.testing.assert_allclose(weights[0], sig[[3, 0]], rtol=1e-6)
    renorm, _ = moe_route_biased(logits, np.zeros(4, np.float32), 2, True)
    np.testing.assert_allclose(renorm[0], sig[:2] / sig[:2].sum(), rtol=1e-6)


def test_backend_without_the_routing_op_is_refused_at_load(registry, tmp_path):
    path = write_tiny_checkpoint(ARCH, tmp_path, registry=registry)
    bare = Registry(make_plugin_manager(allow=[])).create("gpu_backends", "numpy")
    assert "moe_route_biased" not in bare.ops
    with pytest.raises(RuntimeError, match="moe_route_biased"):
        load_model(path, bare, registry=registry)

