"""Registration, checkpoint layouts (VL wrapper, MTP and vision tensors, per-expert vs fused MoE),
config validation, and the state each layer declares for a real Qwen3.5 config."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from qwen35_cases import prompts
from safetensors.numpy import load_file, save_file

from atlas_core.api import KVCacheSpec, RecurrentStateSpec, load_model, read_config
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.forward import ForwardRunner
from atlas_core.testing.fixtures import real_models_dir

REAL_CONFIG = real_models_dir() / "qwen3.5" / "config.json"
ARCHITECTURES = ("Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
                 "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")


def logits(path, backend, registry) -> np.ndarray:
    model = load_model(path, backend, registry=registry)
    return ForwardRunner(model, backend, max_seqs=1).step([prompts()[0]], all_logits=True)[0]


def rewrite(path: Path, edit) -> None:
    tensors = load_file(path / "model.safetensors")
    save_file(edit(tensors), path / "model.safetensors", {"format": "pt"})


def test_registered(registry):
    assert set(ARCHITECTURES) <= set(registry.names("weight_loaders"))
    assert {"gated_deltanet", "gated_attention", "moe_shared_expert"} <= set(registry.names("layers"))
    for arch in ARCHITECTURES:
        assert registry.owner("weight_loaders", arch) == "qwen35"


def text_only_logits(path, backend, registry) -> np.ndarray:
    """Logits of this plugin's own VL loader, which skips the tower (with atlas-qwen3vl
    installed the registered loader is that plugin's, which loads it: tested there)."""
    from atlas_core.api import Checkpoint
    from atlas_qwen35.loaders import Qwen3_5VLLoader

    config = read_config(path)
    model = Qwen3_5VLLoader(registry=registry).load(config, Checkpoint.open(path), backend)
    return ForwardRunner(model, backend, max_seqs=1).step([prompts()[0]], all_logits=True)[0]


def test_vl_checkpoint_skips_vision_and_mtp(registry, backend, tmp_path, caplog):
    path = write_tiny_checkpoint("Qwen3_5ForConditionalGeneration", tmp_path / "vl", registry=registry)
    assert "model.language_model.layers.0.linear_attn.in_proj_qkv.weight" in load_file(
        path / "model.safetensors")
    plain = text_only_logits(path, backend, registry)
    extra = {"model.visual.patch_embed.proj.weight": np.ones((4, 3), np.float32),
             "mtp.fc.weight": np.ones((4, 4), np.float32),
             "mtp.layers.0.input_layernorm.weight": np.ones(4, np.float32)}
    rewrite(path, lambda t: {**t, **extra})
    with caplog.at_level(logging.INFO, logger="atlas_qwen35.loaders"):
        np.testing.assert_array_equal(text_only_logits(path, backend, registry), plain)
    messages = [r.getMessage() for r in caplog.records]
    assert any("2 multi-token-prediction (MTP) head tensors (mtp.*)" in m for m in messages)
    assert any("vision tower tensors (model.visual.*)" in m for m in messages)


def test_moe_per_expert_and_fused_layouts_agree(registry, backend, tmp_path):
    path = write_tiny_checkpoint("Qwen3_5MoeForCausalLM", tmp_path / "moe", registry=registry)
    fused = logits(path, backend, registry)

    def split(tensors):
        out = {}
        for name, t in tensors.items():
            if name.endswith("experts.gate_up_proj"):
                base, inter = name[: -len("gate_up_proj")], t.shape[1] // 2
                for e in range(t.shape[0]):
                    out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].copy()
                    out[f"{base}{e}.up_proj.weight"] = t[e, inter:].copy()
            elif name.endswith("experts.down_proj"):
                base = name[: -len("down_proj")]
                out.update({f"{base}{e}.down_proj.weight": t[e].copy() for e in range(t.shape[0])})
            else:
                out[name] = t
        return out

    rewrite(path, split)
    np.testing.assert_array_equal(logits(path, backend, registry), fused)


def test_bad_layer_types_are_reported(registry, backend, tmp_path):
    path = write_tiny_checkpoint("Qwen3_5ForCausalLM", tmp_path / "m", registry=registry)
    config = json.loads((path / "config.json").read_text())
    cases = [(["linear_attention", "full_attention"], "'layer_types' has 2 entries for num_hidden_layers=4"),
             (["linear_attention", "mamba", "full_attention", "full_attention"], r"unsupported \['mamba'\]")]
    for layer_types, message in cases:
        (path / "config.json").write_text(json.dumps({**config, "layer_types": layer_types}))
        with pytest.raises(ValueError, match=message):
            load_model(path, backend, registry=registry)


@pytest.mark.skipif(not REAL_CONFIG.is_file(), reason="real-model fixtures not present")
def test_real_qwen35_config_layout(registry):
    config = read_config(REAL_CONFIG.parent)
    loader = registry.get("weight_loaders", "Qwen3_5ForConditionalGeneration")()
    model = loader.build(config)
    specs = model.kv_cache_specs()
    assert sum(isinstance(s, KVCacheSpec) for s in specs) == 6
    recurrent = [s for s in specs if isinstance(s, RecurrentStateSpec)]
    assert len(recurrent) == 18
    assert recurrent[0].shapes == {"conv": (3, 6144), "ssm": (16, 128, 128)}
    attention = model.layers[3].mixer
    assert (attention.rotary_dim, attention.head_dim) == (64, 256)
    shapes = loader.checkpoint_tensors(json.loads(REAL_CONFIG.read_text()))
    assert shapes["model.language_model.layers.0.linear_attn.in_proj_qkv.weight"] == (6144, 1024)
    assert shapes["model.language_model.layers.0.linear_attn.conv1d.weight"] == (6144, 1, 4)
    assert shapes["model.language_model.layers.3.self_attn.q_proj.weight"] == (4096, 1024)
    assert "lm_head.weight" not in shapes
