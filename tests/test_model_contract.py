"""The model contract without side doors: declared optional steps, registry through the factory."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np

from atlas_core.hookspecs import hookimpl
from atlas_core.interfaces import StepMetadata, TransformerLayer
from atlas_core.model.decoder_loader import DecoderOnlyLoader
from atlas_core.model.layers.attention import Attention
from atlas_core.model.layers.decoder import DecoderLayer
from atlas_core.model.layers.mlp import GatedMLP
from atlas_core.model.loader import load_model
from atlas_core.model.params import Module
from atlas_core.ops import reference as ref
from atlas_core.plugins import Registry, make_plugin_manager
from atlas_core.testing.checkpoints import write_tiny_checkpoint


def test_the_interfaces_import_nothing_from_the_model():
    code = ("import json, sys, atlas_core.interfaces\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('atlas_core.model'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_step_metadata_is_one_class():
    from atlas_core.model import StepMetadata as from_model

    assert from_model is StepMetadata


class _Scale(Module, TransformerLayer):
    """A layer with only ``forward``: twice its input."""

    def forward(self, hidden, residual, meta):
        return self.ops.add(hidden, hidden), residual


def _numpy_backend():
    return Registry(make_plugin_manager(entry_points=False)).create("gpu_backends", "numpy")


def test_a_layer_without_a_fused_prenorm_gets_the_norm_then_forward():
    layer = _Scale()
    layer.materialize(_numpy_backend(), np.float32)
    rng = np.random.default_rng(0)
    hidden, residual, weight = (rng.standard_normal(s).astype(np.float32)
                                for s in ((3, 8), (3, 8), (8,)))
    out, new_residual = layer.forward_prenorm(hidden, None, weight, 1e-6, False, None)
    np.testing.assert_allclose(out, 2 * ref.rms_norm(hidden, weight, 1e-6), rtol=1e-6)
    np.testing.assert_array_equal(new_residual, hidden)
    out, new_residual = layer.forward_prenorm(hidden, residual, weight, 1e-6, True, None)
    normed, summed = ref.rms_norm(hidden, weight, 1e-6, residual, zero_centered=True)
    np.testing.assert_allclose(out, 2 * normed, rtol=1e-6)
    np.testing.assert_allclose(new_residual, summed, rtol=1e-6)


class _Fused(_Scale):
    def __init__(self):
        super().__init__()
        self.calls = []

    def forward_prenorm(self, hidden, residual, norm_weight, eps, zero_centered, meta):
        self.calls.append((norm_weight, eps, zero_centered, meta))
        return hidden, hidden


def test_the_decoder_hands_each_norm_to_the_layer_behind_it():
    mixer, ffn = _Fused(), _Fused()
    block = DecoderLayer(mixer, ffn, hidden_size=8, rms_norm_eps=1e-5, zero_centered=True)
    block.materialize(_numpy_backend(), np.float32)
    meta = StepMetadata(1, 1, None, None, None, None, None, None)
    block.forward(np.ones((1, 8), np.float32), None, meta)
    assert mixer.calls == [(block.params["input_layernorm.weight"], 1e-5, True, meta)]
    assert ffn.calls == [(block.params["post_attention_layernorm.weight"], 1e-5, True, meta)]


class _CountingMLP(GatedMLP):
    """Records, at ``post_load``, how often it ran and whether the weights were in place."""

    seen: list = []

    def post_load(self):
        self.seen.append(float(np.abs(self.params["down_proj.weight"]).sum()))


class _CountingLoader(DecoderOnlyLoader):
    def layer_factory(self, kind):
        return super().layer_factory("counting_mlp" if kind == "mlp" else kind)

    def tiny_config(self):
        return {"architectures": ["CountingForCausalLM"], "hidden_size": 32,
                "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                "num_key_value_heads": 1, "vocab_size": 320, "max_position_embeddings": 128,
                "rope_theta": 10000.0}


class _Plugin:
    @staticmethod
    @hookimpl
    def register_weight_loaders(register):
        register("CountingForCausalLM", _CountingLoader)

    @staticmethod
    @hookimpl
    def register_layers(register):
        register("counting_mlp", _CountingMLP)


def test_the_loader_gets_its_registry_and_walks_post_load_once(tmp_path):
    pm = make_plugin_manager(entry_points=False)
    pm.register(_Plugin, name="counting")
    registry = Registry(pm)
    path = write_tiny_checkpoint("CountingForCausalLM", tmp_path / "m", registry=registry)
    _CountingMLP.seen.clear()
    model = load_model(path, "numpy", registry=registry)
    assert [type(block.ffn) for block in model.layers] == [_CountingMLP, _CountingMLP]
    assert len(_CountingMLP.seen) == 2 and all(s > 0 for s in _CountingMLP.seen)


def test_a_loader_made_by_hand_finds_the_installed_layer_kinds():
    assert DecoderOnlyLoader().layer_factory("attention") is Attention


def test_the_engine_fakes_live_in_the_testing_kit():
    from atlas_core.testing import fake_model

    assert fake_model.FakeCausalLM.__module__ == "atlas_core.testing.fake_model"
    assert importlib.util.find_spec("atlas_core.engine.fake_model") is None
