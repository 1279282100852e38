"""Gemma4Loader: config formats, clear refusals, the released shapes, the plugin's ops."""

import numpy as np
import pytest

from atlas_core.api import Registry, make_plugin_manager, reference

from atlas_gemma4.loaders import Gemma4Loader
from atlas_gemma4.ops import sliding_window_attention


@pytest.fixture(scope="module")
def registry():
    return Registry(make_plugin_manager(allow=["gemma4"]))


def _loader(registry, arch="Gemma4ForCausalLM"):
    return registry.create("weight_loaders", arch, registry=registry)


def _attention_shapes(model):
    return [(l.attention.head_dim, l.attention.num_kv_heads, l.attention.sliding_window,
             l.attention.k_eq_v) for l in model.layers]


def test_released_and_saved_config_forms_build_the_same_layers(registry):
    released = Gemma4Loader().tiny_config()
    saved = {k: v for k, v in released.items()
             if k not in ("global_head_dim", "num_global_key_value_heads")}
    saved["per_layer_config"] = {"2": {"head_dim": 32, "num_key_value_heads": 1},
                                 "3": {"head_dim": 32, "num_key_value_heads": 1}}
    loader = _loader(registry)
    want = [(16, 2, 8, False), (16, 2, 8, False), (32, 1, None, True), (32, 1, None, True)]
    assert _attention_shapes(loader.build(released)) == want
    assert _attention_shapes(loader.build(saved)) == want


def test_last_layer_is_forced_to_full_attention_as_hf_does(registry):
    config = {**Gemma4Loader().tiny_config(), "layer_types": ["sliding_attention"] * 4}
    assert _attention_shapes(_loader(registry).build(config))[-1][2] is None


@pytest.mark.parametrize("field,value,message", [
    ("hidden_size_per_layer_input", 256, "per-layer input embeddings"),
    ("num_kv_shared_layers", 2, "KV sharing"),
    ("use_bidirectional_attention", "all", "bidirectional"),
    ("layer_types", ["sliding_attention"], "layer_types"),
    ("enable_moe_block", True, "num_experts"),
])
def test_unsupported_configs_are_refused_naming_the_field(registry, field, value, message):
    config = {**Gemma4Loader().tiny_config(), field: value}
    with pytest.raises(ValueError, match=message):
        _loader(registry).validate_config(config)


def _paged_case(rng, window, seq_lens, q_lens):
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    tables = rng.permutation(32).reshape(4, 8).astype(np.int32)
    cache = (32, 4, 2, 8)
    return (rng.standard_normal((int(cu[-1]), 4, 8), dtype=np.float32),
            rng.standard_normal(cache, dtype=np.float32),
            rng.standard_normal(cache, dtype=np.float32), tables,
            np.array(seq_lens, np.int32), cu, 0.35)


def test_a_window_longer_than_the_context_is_plain_paged_attention():
    args = _paged_case(np.random.default_rng(0), 0, [5, 17, 30, 2], [5, 1, 4, 2])
    np.testing.assert_allclose(sliding_window_attention(*args, window=64),
                               reference.paged_attention(*args), atol=1e-6)


def test_blocks_before_the_window_are_never_read():
    rng = np.random.default_rng(1)
    q, k, v, tables, seq_lens, cu, scale = _paged_case(rng, 0, [30, 30, 30, 30], [1, 3, 1, 1])
    want = sliding_window_attention(q, k, v, tables, seq_lens, cu, scale, window=6)
    stale = tables.copy()
    stale[:, :5] = -7
    got = sliding_window_attention(q, k, v, stale, seq_lens, cu, scale, window=6)
    np.testing.assert_array_equal(got, want)
    assert not np.allclose(want, reference.paged_attention(q, k, v, tables, seq_lens, cu, scale))


def test_numpy_backend_runs_the_plugin_ops(registry):
    backend = registry.create("gpu_backends", "numpy")
    for name in ("mul", "softcap", "sliding_window_attention"):
        assert name in backend.ops


def _refusal(registry, backend, tmp_path):
    from atlas_core.api import Checkpoint, write_safetensors

    loader = _loader(registry)
    config = Gemma4Loader().tiny_config()
    shapes = loader.checkpoint_tensors(config)
    write_safetensors(tmp_path / "model.safetensors",
                      {n: np.zeros(s, np.float32) for n, s in shapes.items()}, {"format": "pt"})
    with pytest.raises(ValueError, match="sliding_window_attention.*numpy backend"):
        loader.load(config, Checkpoint.open(tmp_path), backend)


def test_a_backend_without_the_plugin_ops_is_refused_before_loading(registry, tmp_path):
    bare = Registry(make_plugin_manager(allow=[])).create("gpu_backends", "numpy")
    assert "softcap" not in bare.ops
    _refusal(registry, bare, tmp_path)


def test_every_plugin_op_has_a_cuda_implementation_and_sources():
    from atlas_core.api import OpRegistry

    from atlas_gemma4.cuda import kernel_dir

    ops = OpRegistry(Registry(make_plugin_manager(allow=["gemma4"])))
    for name in ("mul", "softcap", "sliding_window_attention"):
        assert "cuda" in ops.backends(name), name
    assert kernel_dir() in ops.kernel_source_dirs()
    assert {p.name for p in kernel_dir().glob("*.cu")} == {
        "gemma4_elementwise.cu", "gemma4_attention.cu", "gemma4_attention_mma.cu"}


def test_the_reference_with_window_0_is_full_causal_attention():
    args = _paged_case(np.random.default_rng(2), 0, [5, 17, 30, 2], [5, 3, 4, 2])
    np.testing.assert_allclose(sliding_window_attention(*args, window=0),
                               reference.paged_attention(*args), atol=1e-6)


def test_real_gemma3_config_builds_the_released_text_model(registry):
    """``Gemma3ForConditionalGeneration`` (google/gemma-3-4b-it's config.json, which leaves most
    fields to the HF defaults)."""
    from atlas_core.api import read_config
    from atlas_core.testing.fixtures import real_models_dir

    folder = real_models_dir() / "gemma-3"
    if not folder.is_dir():
        pytest.skip("real-model fixtures not present")
    config = read_config(folder)
    loader = _loader(registry, config["architectures"][0])
    assert 3.8e9 < loader.parameter_count(config) < 3.95e9
    model = loader.build(config)
    first, sixth = model.layers[0].attention, model.layers[5].attention
    assert (first.sliding_window, sixth.sliding_window) == (1024, None)
    assert first.rope == {"rope_type": "default", "rope_theta": 10000.0}
    assert sixth.rope == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}
    assert first.scale == 256 ** -0.5 and model.zero_centered_norm


@pytest.mark.parametrize("arch", ["Gemma4ForCausalLM", "Gemma4ForConditionalGeneration",
                                  "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"])
def test_tiny_checkpoints_of_every_architecture_load_and_run(registry, tmp_path, arch):
    from atlas_core.api import load_model
    from atlas_core.testing.checkpoints import write_tiny_checkpoint
    from atlas_core.testing.forward import ForwardRunner

    model = load_model(write_tiny_checkpoint(arch, tmp_path, registry=registry), "numpy",
                       registry=registry)
    logits = ForwardRunner(model, model.backend, max_seq_len=32).step([list(range(20))])[0]
    assert logits.shape == (1, 384) and np.isfinite(logits).all()
