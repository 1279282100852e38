"""config.json as each transformers release writes it (issue #30): fields under old and new
names, HF's per-class defaults for absent fields, and install hints that name real plugins."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from atlas_core.model.config_fields import canonical_config, head_dim_from_heads
from atlas_core.model.loader import KNOWN_FAMILIES, ModelConfigError, create_loader, read_config
from atlas_core.plugins import Registry, make_plugin_manager

ROOT = Path(__file__).resolve().parents[1]
MINIMAL = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 4,
           "vocab_size": 384, "intermediate_size": 96}
#: Atlas architecture -> the installed transformers config class it mirrors.
HF_CLASSES = {"Qwen3ForCausalLM": "Qwen3Config", "Qwen3MoeForCausalLM": "Qwen3MoeConfig",
              "LlamaForCausalLM": "LlamaConfig", "MistralForCausalLM": "MistralConfig",
              "Qwen3NextForCausalLM": "Qwen3NextConfig", "Qwen3_5ForCausalLM": "Qwen3_5TextConfig",
              "Qwen3_5MoeForCausalLM": "Qwen3_5MoeTextConfig"}


@pytest.fixture(scope="module")
def registry():
    return Registry(make_plugin_manager(allow=["qwen3", "qwen35"]))


def test_canonical_config_reads_every_name():
    new = canonical_config({"num_local_experts": 8, "dtype": "bfloat16"})
    assert (new["num_experts"], new["torch_dtype"]) == (8, "bfloat16")
    assert canonical_config({"num_experts": 4, "num_local_experts": 8})["num_experts"] == 4


def test_canonical_config_defaults_only_absent_fields():
    defaults = {"head_dim": head_dim_from_heads, "norm_topk_prob": False}
    filled = canonical_config(MINIMAL, defaults)
    assert (filled["head_dim"], filled["norm_topk_prob"]) == (16, False)
    kept = canonical_config({**MINIMAL, "head_dim": None, "norm_topk_prob": True}, defaults)
    assert (kept["head_dim"], kept["norm_topk_prob"]) == (None, True)
    assert "head_dim" not in MINIMAL


def test_read_config_finds_renamed_fields(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["Qwen3MoeForCausalLM"], "num_local_experts": 8, "dtype": "bfloat16"}))
    config = read_config(tmp_path)
    assert (config["num_experts"], config["torch_dtype"]) == (8, "bfloat16")


def _hf_value(hf, name):
    if name == "head_dim":
        return getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    return getattr(hf, name)


@pytest.mark.parametrize("arch", sorted(HF_CLASSES))
def test_absent_fields_mean_what_they_mean_in_hf(registry, arch):
    transformers = pytest.importorskip("transformers")
    hf = getattr(transformers, HF_CLASSES[arch]).from_dict(dict(MINIMAL))
    loader = create_loader(registry, arch)
    resolved = loader.resolve_config({"architectures": [arch], **MINIMAL})
    checked = [n for n in loader.config_defaults if hasattr(hf, n) or n == "head_dim"]
    assert {"head_dim", "num_key_value_heads", "max_position_embeddings"} <= set(checked)
    for name in checked:
        want = _hf_value(hf, name)
        got = loader.head_dim(resolved) if name == "head_dim" else resolved[name]
        assert got == want, f"{arch}: absent {name!r} is {got!r} in Atlas, {want!r} in HF"


@pytest.mark.parametrize("arch, renormalized", [("Qwen3MoeForCausalLM", False),
                                                ("Qwen3NextForCausalLM", True),
                                                ("Qwen3_5MoeForCausalLM", True)])
def test_norm_topk_prob_default_per_architecture(registry, arch, renormalized):
    transformers = pytest.importorskip("transformers")
    loader = create_loader(registry, arch)
    config = loader.resolve_config({"architectures": [arch], **MINIMAL, "num_experts": 8,
                                    "num_experts_per_tok": 2, "moe_intermediate_size": 32})
    assert loader.moe_kwargs(config, 0)["norm_topk_prob"] is renormalized
    hf = getattr(transformers, HF_CLASSES[arch]).from_dict(dict(MINIMAL))
    assert getattr(hf, "norm_topk_prob", True) is renormalized


MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
LINEAR = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
          "linear_value_head_dim": 16}
EXTRA = {"Qwen3MoeForCausalLM": MOE, "Qwen3NextForCausalLM": {**MOE, **LINEAR},
         "Qwen3_5ForCausalLM": LINEAR, "Qwen3_5MoeForCausalLM": {**MOE, **LINEAR}}


@pytest.mark.parametrize("arch", sorted(HF_CLASSES))
def test_configs_saved_by_installed_transformers(tmp_path, registry, arch):
    """Every architecture's config as the installed transformers saves it: Atlas sizes the
    model exactly as HF builds it (same parameter count)."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_config = getattr(transformers, HF_CLASSES[arch])(**MINIMAL, num_key_value_heads=2,
                                                         **EXTRA.get(arch, {}))
    hf_config.architectures = [arch]
    hf_config.save_pretrained(tmp_path)
    config = read_config(tmp_path)
    loader = create_loader(registry, arch)
    loader.validate_config(config)
    hf = transformers.AutoModelForCausalLM.from_config(hf_config)
    assert loader.parameter_count(config) == sum(p.numel() for p in hf.parameters())


def _tiny_hf_moe(tmp_path, edit=None):
    """A Qwen3-MoE checkpoint saved by the installed transformers, config edited by ``edit``."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3MoeConfig(
        vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, moe_intermediate_size=32,
        num_experts=8, num_experts_per_tok=2, max_position_embeddings=256)
    torch.manual_seed(0)
    transformers.Qwen3MoeForCausalLM(config).save_pretrained(tmp_path)
    if edit is not None:
        path = tmp_path / "config.json"
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    return hf, torch


def _assert_same_logits(tmp_path, registry, hf, torch):
    from atlas_core.model import load_model
    from atlas_core.testing.forward import ForwardRunner
    model = load_model(tmp_path, "numpy", registry=registry, dtype="float32")
    ids = [3, 17, 250, 9, 41, 100, 7, 7, 300]
    got = ForwardRunner(model, model.backend, max_seq_len=32).step([ids], all_logits=True)[0]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].float().numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_qwen3_moe_saved_by_installed_transformers(tmp_path, registry):
    hf, torch = _tiny_hf_moe(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "num_local_experts" in saved and saved.get("num_experts") is None
    _assert_same_logits(tmp_path, registry, hf, torch)


def test_qwen3_moe_without_norm_topk_prob_uses_hf_default(tmp_path, registry):
    hf, torch = _tiny_hf_moe(tmp_path, lambda c: {k: v for k, v in c.items()
                                                  if k != "norm_topk_prob"})
    assert hf.config.norm_topk_prob is False
    _assert_same_logits(tmp_path, registry, hf, torch)


def test_qwen3_moe_old_style_config(tmp_path, registry):
    def old_style(config):
        config = {k: v for k, v in config.items()
                  if k not in ("num_local_experts", "dtype", "rope_parameters")}
        return {**config, "num_experts": 8, "torch_dtype": "float32", "rope_theta": 1000000.0,
                "rope_scaling": None, "norm_topk_prob": True}
    hf, torch = _tiny_hf_moe(tmp_path, old_style)
    assert hf.config.norm_topk_prob is True and hf.config.num_experts == 8
    _assert_same_logits(tmp_path, registry, hf, torch)


def _workspace_distributions() -> set[str]:
    names = {tomllib.loads(p.read_text())["project"]["name"]
             for p in (ROOT / "plugins").glob("*/pyproject.toml")}
    return names | {tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]}


def test_install_hints_name_only_existing_distributions(registry):
    assert set(KNOWN_FAMILIES) <= _workspace_distributions()
    for info in registry.plugins():
        for arch in info.registered.get("weight_loaders", []):
            assert arch in KNOWN_FAMILIES.get(info.dist, ()), (arch, info.dist)


@pytest.mark.parametrize("arch", ["Gemma3nForConditionalGeneration",
                                  "DeepseekV2ForCausalLM",
                                  "Glm4vForConditionalGeneration"])
def test_unsupported_architecture_names_no_made_up_plugin(arch):
    empty = Registry(make_plugin_manager(allow=[]))
    with pytest.raises(ModelConfigError) as exc:
        create_loader(empty, arch)
    assert "pip install" not in str(exc.value) and "no known plugin" in str(exc.value)


def test_supported_architecture_names_its_plugin():
    empty = Registry(make_plugin_manager(allow=[]))
    with pytest.raises(ModelConfigError, match="pip install atlas-qwen35"):
        create_loader(empty, "Qwen3_5MoeForConditionalGeneration")
    with pytest.raises(ModelConfigError, match="pip install atlas-minimax"):
        create_loader(empty, "MiniMaxM2ForCausalLM")
    with pytest.raises(ModelConfigError, match="pip install atlas-nemotron-h"):
        create_loader(empty, "NemotronHForCausalLM")
    with pytest.raises(ModelConfigError, match="pip install atlas-gemma4"):
        create_loader(empty, "Gemma4ForConditionalGeneration")
