"""The example plugin is found through its real entry point and runs, matching HF Llama."""

from __future__ import annotations

import json
from importlib import metadata

import numpy as np
import pytest

from atlas_core.api import Registry, load_model, make_plugin_manager
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.forward import ForwardRunner
from atlas_toy.loader import normalize


def test_entry_point_is_discovered():
    names = {ep.name: ep.value for ep in metadata.entry_points(group="atlas")}
    assert names.get("toy") == "atlas_toy.plugin", "pip install -e examples/atlas-toy"
    reg = Registry(make_plugin_manager())
    assert "ToyForCausalLM" in reg.names("weight_loaders")
    assert reg.owner("weight_loaders", "ToyForCausalLM") == "toy"


def test_allow_list_can_leave_it_out(monkeypatch):
    monkeypatch.setenv("ATLAS_PLUGINS", "qwen3")
    reg = Registry(make_plugin_manager())
    assert "ToyForCausalLM" not in reg.names("weight_loaders")


def test_tiny_toy_model_matches_hf_llama(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = write_tiny_checkpoint("ToyForCausalLM", tmp_path / "toy")
    backend = Registry().create("gpu_backends", "numpy")
    model = load_model(path, backend)
    prompt = [5, 17, 42, 99, 3, 250, 7, 11, 64, 128, 200, 31, 8, 9, 10, 12, 13, 14]
    runner = ForwardRunner(model, backend, max_seqs=1, max_seq_len=64)
    ours = runner.step([prompt], all_logits=True)[0]

    config = normalize(json.loads((path / "config.json").read_text()))
    config.update(architectures=["LlamaForCausalLM"], model_type="llama")
    (path / "config.json").write_text(json.dumps(config))
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0].numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=1e-4)
