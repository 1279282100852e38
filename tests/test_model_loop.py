"""The generic model loop on the numpy backend with a tiny in-test architecture (no plugins).

Covers: attributes and KV specs, prefill vs chunked prefill vs decode, mixed batches, tied
embeddings, sharded / wrapped / fused-expert / fp8 checkpoints, and load errors.
"""

import json

import ml_dtypes
import numpy as np
import pytest

from atlas_core.hookspecs import hookimpl
from atlas_core.interfaces import KVCacheSpec
from atlas_core.model import CausalLM, DecoderOnlyLoader, ModelConfigError, WeightLoadError, load_model
from atlas_core.ops.quant import dequantize
from atlas_core.plugins import Registry, make_plugin_manager
from atlas_core.testing.checkpoints import tiny_architectures, write_tiny_checkpoint
from atlas_core.testing.forward import ForwardRunner
from atlas_core.weights import Checkpoint, write_safetensors


class TinyLoader(DecoderOnlyLoader):
    def tiny_config(self):
        return {"architectures": ["TinyForCausalLM"], "hidden_size": 32, "intermediate_size": 48,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 8, "vocab_size": 300, "max_position_embeddings": 128,
                "rope_theta": 10000.0, "rms_norm_eps": 1e-6}


class TinyMoeLoader(TinyLoader):
    def is_sparse(self, config, layer_idx):
        return layer_idx == 1

    def tiny_config(self):
        return {**super().tiny_config(), "architectures": ["TinyMoeForCausalLM"], "num_experts": 4,
                "num_experts_per_tok": 2, "moe_intermediate_size": 16, "norm_topk_prob": False}


class _TinyPlugin:
    @hookimpl
    def register_weight_loaders(self, register):
        register("TinyForCausalLM", TinyLoader)
        register("TinyMoeForCausalLM", TinyMoeLoader)


@pytest.fixture(scope="module")
def registry():
    pm = make_plugin_manager(entry_points=False)
    pm.register(_TinyPlugin(), name="tiny")
    return Registry(pm)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, registry):
    return write_tiny_checkpoint("TinyForCausalLM", tmp_path_factory.mktemp("tiny"), registry=registry)


def _load(path, registry, **kw):
    return load_model(path, "numpy", registry=registry, **kw)


def _logits(model, ids, **kw):
    return ForwardRunner(model, model.backend, **kw).step([ids], all_logits=True)[0]


PROMPT = np.random.default_rng(0).integers(0, 290, 35).tolist()


def test_attributes_and_kv_specs(tiny, registry):
    model = _load(tiny, registry)
    assert isinstance(model, CausalLM) and model.path == tiny
    assert (model.num_layers, model.hidden_size, model.vocab_size) == (2, 32, 300)
    assert model.dtype == np.float32 and model.max_position_embeddings == 128
    assert model.config["architectures"] == ["TinyForCausalLM"]
    assert model.kv_cache_specs() == [KVCacheSpec(num_kv_heads=2, head_dim=8)] * 2
    assert "TinyForCausalLM" in tiny_architectures(registry)


def test_bf16_hidden_and_float32_logits(tiny, registry):
    model = _load(tiny, registry, dtype="bfloat16")
    runner = ForwardRunner(model, model.backend)
    meta = runner.metadata([0], [5], all_logits=True)
    hidden = model.forward(np.arange(5, dtype=np.int32), meta)
    assert hidden.shape == (5, 32) and hidden.dtype == ml_dtypes.bfloat16
    logits = model.compute_logits(hidden, meta.logits_indices)
    assert logits.shape == (5, 300) and logits.dtype == np.float32


def test_chunked_prefill_and_decode_match_full_prefill(tiny, registry):
    model = _load(tiny, registry)
    full = _logits(model, PROMPT)
    runner = ForwardRunner(model, model.backend)
    chunks = [runner.step([PROMPT[a:b]], all_logits=True)[0] for a, b in ((0, 10), (10, 30))]
    decoded = [runner.step([[t]])[0] for t in PROMPT[30:]]
    np.testing.assert_allclose(np.concatenate(chunks + decoded), full, rtol=0, atol=1e-5)


def test_mixed_decode_and_prefill_step(tiny, registry):
    model = _load(tiny, registry)
    other = PROMPT[::-1][:20]
    runner = ForwardRunner(model, model.backend)
    runner.step([PROMPT[:17]], seq_ids=[0])
    runner.step([other[:4]], seq_ids=[1])
    mixed = runner.step([[PROMPT[17]], other[4:]], seq_ids=[0, 1], all_logits=True)
    np.testing.assert_allclose(mixed[0][0], _logits(model, PROMPT[:18])[-1], rtol=0, atol=1e-5)
    np.testing.assert_allclose(mixed[1], _logits(model, other)[4:], rtol=0, atol=1e-5)


def test_tied_embeddings(tmp_path, registry):
    path = write_tiny_checkpoint("TinyForCausalLM", tmp_path, registry=registry, tie_word_embeddings=True)
    assert "lm_head.weight" not in Checkpoint.open(path)
    model = _load(path, registry)
    assert model.lm_head is model.params["model.embed_tokens.weight"]


def test_sharded_checkpoint_same_logits(tiny, tmp_path, registry):
    sharded = write_tiny_checkpoint("TinyForCausalLM", tmp_path, registry=registry, shards=2)
    assert (sharded / "model.safetensors.index.json").is_file()
    np.testing.assert_array_equal(_logits(_load(sharded, registry), PROMPT),
                                  _logits(_load(tiny, registry), PROMPT))


def _rewrite(src, dst, transform, config_update=None):
    dst.mkdir(exist_ok=True)
    ckpt = Checkpoint.open(src)
    tensors = transform({n: np.array(ckpt.get(n)) for n in ckpt.names()})
    write_safetensors(dst / "model.safetensors", tensors)
    config = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(config_update(config) if config_update else config))
    return dst


def test_multimodal_wrapper_prefix_and_text_config(tiny, tmp_path, registry):
    def wrap(tensors):
        return {n.replace("model.", "model.language_model.", 1): t for n, t in tensors.items()}

    def config(c):
        return {"architectures": c["architectures"], "torch_dtype": "float32", "text_config": c}
    wrapped = _rewrite(tiny, tmp_path / "wrapped", wrap, config)
    np.testing.assert_array_equal(_logits(_load(wrapped, registry), PROMPT),
                                  _logits(_load(tiny, registry), PROMPT))


def test_moe_per_expert_and_fused_experts_agree(tmp_path, registry):
    path = write_tiny_checkpoint("TinyMoeForCausalLM", tmp_path / "moe", registry=registry)

    def fuse(tensors):
        p = "model.layers.1.mlp.experts."
        gu = [np.concatenate([tensors.pop(f"{p}{e}.gate_proj.weight"),
                              tensors.pop(f"{p}{e}.up_proj.weight")]) for e in range(4)]
        down = [tensors.pop(f"{p}{e}.down_proj.weight") for e in range(4)]
        return {**tensors, p + "gate_up_proj": np.stack(gu), p + "down_proj": np.stack(down)}
    fused = _rewrite(path, tmp_path / "fused", fuse)
    np.testing.assert_array_equal(_logits(_load(fused, registry), PROMPT),
                                  _logits(_load(path, registry), PROMPT))


def test_fp8_block_scaled_weights_are_dequantised(tiny, tmp_path, registry):
    name = "model.layers.0.mlp.down_proj.weight"  # [32, 48]: 2 x 3 blocks of 16 x 16
    scale = np.array([[0.5, 1.0, 2.0], [4.0, 0.25, 1.5]], dtype=np.float32)

    def quantise(tensors):
        tensors[name] = tensors[name].astype(ml_dtypes.float8_e4m3fn)
        tensors[name + "_scale_inv"] = scale
        return tensors

    def block_config(config):
        return {**config, "quantization_config": {"quant_method": "fp8", "weight_block_size": [16, 16]}}
    fp8 = _rewrite(tiny, tmp_path / "fp8", quantise, block_config)
    model = _load(fp8, registry)
    want = Checkpoint.open(fp8).get(name).astype(np.float32) * np.kron(scale, np.ones((16, 16)))
    kept = model.layers[0].ffn.params["down_proj.weight"]
    assert kept.format == "fp8_block" and kept.block_size == (16, 16)
    np.testing.assert_array_equal(dequantize(kept), want)


def test_missing_and_misshaped_tensors(tiny, tmp_path, registry):
    name = "model.layers.1.self_attn.k_proj.weight"
    missing = _rewrite(tiny, tmp_path / "missing", lambda t: {n: v for n, v in t.items() if n != name})
    with pytest.raises(WeightLoadError, match=rf"missing tensor '{name}' \(expected shape \[16, 32\]\)"):
        _load(missing, registry)
    bad = _rewrite(tiny, tmp_path / "bad", lambda t: {**t, name: t[name][:8]})
    with pytest.raises(WeightLoadError, match=rf"'{name}' .* has shape \[8, 32\], expected \[16, 32\]"):
        _load(bad, registry)


def test_config_errors(tmp_path, registry):
    with pytest.raises(ModelConfigError, match="no config.json"):
        _load(tmp_path, registry)
    for arch, hint in (("Qwen3_5ForConditionalGeneration", "pip install atlas-qwen35"),
                       ("NemotronHForCausalLM", "pip install atlas-nemotron-h"),
                       ("FooForCausalLM", "no known plugin")):
        (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch]}))
        with pytest.raises(ModelConfigError, match=f"{arch!r}.*registered: Tiny.*{hint}"):
            _load(tmp_path, registry)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelConfigError, match="no 'architectures'"):
        _load(tmp_path, registry)


def test_tiny_checkpoints_are_deterministic(tmp_path, registry):
    a = write_tiny_checkpoint("TinyForCausalLM", tmp_path / "a", registry=registry, seed=1)
    b = write_tiny_checkpoint("TinyForCausalLM", tmp_path / "b", registry=registry, seed=1)
    c = write_tiny_checkpoint("TinyForCausalLM", tmp_path / "c", registry=registry, seed=2)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (c / "tokenizer.json").read_bytes()


def test_partial_rotary(tmp_path, registry):
    path = write_tiny_checkpoint("TinyForCausalLM", tmp_path, registry=registry,
                                 partial_rotary_factor=0.5)
    model = _load(path, registry)
    assert model.layers[0].mixer.rotary_dim == 4
    assert np.isfinite(_logits(model, PROMPT[:20])).all()
