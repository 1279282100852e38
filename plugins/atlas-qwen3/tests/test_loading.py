"""The atlas-qwen3 plugin: registration, tiny checkpoints, config handling and load errors."""

import importlib
import json
import subprocess
import sys

import numpy as np
import pytest

from atlas_core.api import (Checkpoint, KVCacheSpec, ModelConfigError, Registry, WeightLoadError,
                            load_model, make_plugin_manager, write_safetensors)
from atlas_core.testing.checkpoints import tiny_architectures, write_tiny_checkpoint

ARCHS = ["LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"]


@pytest.fixture(scope="module")
def registry():
    return Registry(make_plugin_manager(allow=["qwen3"]))


def test_registers_every_architecture_lazily(registry):
    assert tiny_architectures(registry) == ARCHS
    assert all(registry.owner("weight_loaders", a) == "qwen3" for a in ARCHS)
    code = ("import sys, atlas_qwen3.plugin; "
            "print(sorted(m for m in sys.modules if m.startswith(('atlas_core.model.', 'numpy', 'torch'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_checkpoint_loads_and_runs(arch, tmp_path, registry):
    path = write_tiny_checkpoint(arch, tmp_path, registry=registry, dtype="bfloat16")
    for f in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
              "tokenizer_config.json"):
        assert (path / f).is_file()
    config = json.loads((path / "config.json").read_text())
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    assert len(tokenizer["model"]["vocab"]) + len(tokenizer["added_tokens"]) == config["vocab_size"]
    assert "<|im_start|>" in json.loads((path / "tokenizer_config.json").read_text())["chat_template"]
    model = load_model(path, "numpy", registry=registry)
    assert model.num_layers == config["num_hidden_layers"] and str(model.dtype) == "bfloat16"
    assert model.kv_cache_specs()[0] == KVCacheSpec(num_kv_heads=2, head_dim=16)


def test_qwen3_moe_sparse_layer_selection(tmp_path, registry):
    path = write_tiny_checkpoint("Qwen3MoeForCausalLM", tmp_path, registry=registry,
                                 num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[3])
    model = load_model(path, "numpy", registry=registry)
    kinds = [type(layer.ffn).__name__ for layer in model.layers]
    assert kinds == ["GatedMLP", "SparseMoE", "GatedMLP", "GatedMLP"]
    assert model.layers[1].ffn.top_k == 2 and model.layers[1].ffn.renormalize is True
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in Checkpoint.open(path)


def test_qwen3_has_qk_norm_and_llama_does_not(tmp_path, registry):
    qwen = load_model(write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path / "q", registry=registry),
                      "numpy", registry=registry)
    llama = load_model(write_tiny_checkpoint("LlamaForCausalLM", tmp_path / "l", registry=registry),
                       "numpy", registry=registry)
    assert "q_norm.weight" in qwen.layers[0].mixer.params
    assert "q_norm.weight" not in llama.layers[0].mixer.params
    assert llama.layers[0].mixer.rope["rope_type"] == "llama3"


def test_mistral_sliding_window_caps_context(tmp_path, registry):
    path = write_tiny_checkpoint("MistralForCausalLM", tmp_path, registry=registry, sliding_window=256)
    assert load_model(path, "numpy", registry=registry).max_position_embeddings == 256


def _drop_or_reshape(path, name, keep_rows=None):
    ckpt = Checkpoint.open(path)
    tensors = {n: np.array(ckpt.get(n)) for n in ckpt.names() if n != name or keep_rows}
    if keep_rows:
        tensors[name] = tensors[name][:keep_rows]
    del ckpt
    write_safetensors(path / "model.safetensors", tensors)


def test_missing_tensor_error(tmp_path, registry):
    path = write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path, registry=registry)
    _drop_or_reshape(path, "model.layers.0.self_attn.q_norm.weight")
    with pytest.raises(WeightLoadError, match=r"missing tensor 'model.layers.0.self_attn.q_norm.weight' "
                                              r"\(expected shape \[16\]\)"):
        load_model(path, "numpy", registry=registry)


def test_misshaped_tensor_error(tmp_path, registry):
    path = write_tiny_checkpoint("Qwen3MoeForCausalLM", tmp_path, registry=registry)
    name = "model.layers.0.mlp.experts.3.up_proj.weight"
    _drop_or_reshape(path, name, keep_rows=16)
    with pytest.raises(WeightLoadError, match=rf"'{name}' in .* has shape \[16, 64\], expected \[32, 64\]"):
        load_model(path, "numpy", registry=registry)


def test_unknown_architecture_error(tmp_path, registry):
    path = write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path, registry=registry,
                                 architectures=["Qwen3NextForCausalLM"])
    with pytest.raises(ModelConfigError, match="'Qwen3NextForCausalLM'.*registered: LlamaForCausalLM, "
                                               "MistralForCausalLM.*pip install atlas-qwen35"):
        load_model(path, "numpy", registry=registry)


def test_plugin_module_is_importable():
    assert importlib.import_module("atlas_qwen3.loaders").Qwen3MoeLoader().tiny_config()["num_experts"] == 8
