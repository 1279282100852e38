"""Quantized checkpoints load kept quantized: every format, dense and MoE, parity with the
float model of the dequantized weights, memory, and the dequantize-at-load fallbacks."""

import json
import logging

import ml_dtypes
import numpy as np
import pytest

from atlas_core.model import load_model
from atlas_core.model.quantized_loading import describe_weight_bytes, weight_bytes
from atlas_core.ops.quant import QuantizedWeight
from atlas_core.plugins import Registry
from atlas_core.testing.forward import ForwardRunner
from atlas_core.testing.quant_checkpoints import SCHEME_FORMATS, SCHEMES, write_quantized_checkpoint
from atlas_core.weights import Checkpoint, write_safetensors
from atlas_core.weights.quant_tensors import QuantizedTensorError

PROMPT = [5, 9, 200, 31, 7, 64]
ONE_BYTE = {np.dtype(np.uint8), np.dtype(ml_dtypes.float8_e4m3fn)}
MODELS = [("Qwen3ForCausalLM", False), ("Qwen3MoeForCausalLM", False),
          ("Qwen3MoeForCausalLM", True)]


@pytest.fixture(scope="module")
def registry():
    return Registry()


def _kept(model):
    return {full: module.params[local] for full, module, local, _ in model.named_specs()
            if isinstance(module.params[local], QuantizedWeight)}


def _run(model, greedy=0):
    runner = ForwardRunner(model, model.backend, max_seq_len=32)
    if greedy:
        return runner.greedy([PROMPT], num_tokens=greedy)
    return runner.step([PROMPT], all_logits=True)[0]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("arch, fused", MODELS, ids=["qwen3", "qwen3-moe", "qwen3-moe-fused"])
def test_quantized_checkpoint_matches_its_dequantized_float_model(tmp_path, registry, scheme,
                                                                  arch, fused):
    q = write_quantized_checkpoint(arch, tmp_path / "q", scheme, reference=tmp_path / "ref",
                                   fused_experts=fused, registry=registry)
    model = load_model(q, "numpy", registry=registry, dtype="float32")
    reference = load_model(tmp_path / "ref", "numpy", registry=registry, dtype="float32")
    kept = _kept(model)
    assert len(kept) == (8 if arch == "Qwen3ForCausalLM" else 12)
    assert {w.format for w in kept.values()} <= {SCHEME_FORMATS[scheme], "fp8_channel"}
    assert all(w.data.dtype in ONE_BYTE for w in kept.values())
    np.testing.assert_array_equal(_run(model), _run(reference))
    assert _run(model, greedy=6) == _run(reference, greedy=6)


@pytest.mark.parametrize("scheme", ["fp8_block", "fp8_tensor_modelopt", "nvfp4_modelopt",
                                    "nvfp4_ct"])
@pytest.mark.parametrize("arch", ["Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"])
def test_qwen35_hybrid_keeps_its_linears_quantized(tmp_path, registry, scheme, arch):
    """Gated DeltaNet's in_proj stays quantized (sliced into row blocks by the layer); the
    gated attention's qkv_proj, which the layer reorders on the host, is dequantized."""
    q = write_quantized_checkpoint(arch, tmp_path / "q", scheme, reference=tmp_path / "ref",
                                   registry=registry)
    model = load_model(q, "numpy", registry=registry, dtype="float32")
    kept = _kept(model)
    assert not any(n.endswith("self_attn.qkv_proj.weight") for n in kept)
    assert any(n.endswith("self_attn.o_proj.weight") for n in kept)
    if scheme != "fp8_block":
        assert any(n.endswith("linear_attn.in_proj.weight") for n in kept)
    reference = load_model(tmp_path / "ref", "numpy", registry=registry, dtype="float32")
    np.testing.assert_array_equal(_run(model), _run(reference))
    assert _run(model, greedy=4) == _run(reference, greedy=4)


@pytest.mark.parametrize("scheme", ["fp8_block", "nvfp4_modelopt", "nvfp4_ct"])
def test_device_memory_after_load_is_the_quantized_checkpoint_size(tmp_path, registry, scheme):
    """The weights stay 1-byte (fp8) or half-byte (nvfp4) arrays: the model holds the
    checkpoint's bytes (less the unused activation scales), far less than in bf16."""
    q = write_quantized_checkpoint("Qwen3MoeForCausalLM", tmp_path / "q", scheme,
                                   reference=tmp_path / "ref", registry=registry)
    model = load_model(q, "numpy", registry=registry)
    counts = weight_bytes(model)
    ckpt = Checkpoint.open(q)
    inputs = sum(ckpt.get(n).nbytes for n in ckpt.names()
                 if n.endswith(("input_scale", "input_global_scale")))
    # fused projections keep one NVFP4 global scale where the checkpoint stores one each
    assert 0 <= ckpt.nbytes - inputs - sum(counts.values()) <= 4 * 64
    bf16 = load_model(tmp_path / "ref", "numpy", registry=registry, dtype="bfloat16")
    quantized = sum(v for k, v in counts.items() if k != "bfloat16")
    assert quantized < 0.6 * (sum(weight_bytes(bf16).values()) - counts["bfloat16"])
    assert describe_weight_bytes(counts).startswith(f"{sum(counts.values()) / 2**20:.2f} MiB (")


def test_a_backend_without_the_format_gets_dequantized_weights(tmp_path, registry, caplog):
    q = write_quantized_checkpoint("Qwen3MoeForCausalLM", tmp_path / "q", "nvfp4_modelopt",
                                   reference=tmp_path / "ref", registry=registry)
    backend = registry.create("gpu_backends", "numpy")
    backend.quantized_weight_formats = frozenset({"fp8_block"})
    with caplog.at_level(logging.WARNING):
        model = load_model(q, backend, registry=registry, dtype="float32")
    assert not _kept(model)
    assert "the backend runs no nvfp4 weights" in caplog.text
    reference = load_model(tmp_path / "ref", "numpy", registry=registry, dtype="float32")
    np.testing.assert_array_equal(_run(model), _run(reference))


def test_fp8_blocks_split_by_a_packed_projection_are_dequantized_not_requantized(
        tmp_path, registry, caplog):
    """q_proj has 64 rows: with 48-row blocks k_proj starts mid-block, so qkv_proj cannot keep
    the blocks; the single-source down_proj can."""
    q = write_quantized_checkpoint("Qwen3ForCausalLM", tmp_path / "q", "fp8_block",
                                   reference=tmp_path / "ref", block_size=(48, 16),
                                   registry=registry)
    with caplog.at_level(logging.WARNING):
        model = load_model(q, "numpy", registry=registry, dtype="float32")
    kept = _kept(model)
    assert not any(n.endswith("qkv_proj.weight") for n in kept)
    assert any(n.endswith("down_proj.weight") for n in kept)
    assert "scale blocks" in caplog.text
    reference = load_model(tmp_path / "ref", "numpy", registry=registry, dtype="float32")
    np.testing.assert_array_equal(_run(model), _run(reference))


def _edit(path, fn):
    ckpt = Checkpoint.open(path)
    tensors = fn({n: np.array(ckpt.get(n)) for n in ckpt.names()})
    del ckpt
    write_safetensors(path / "model.safetensors", tensors)


def test_nvfp4_projections_with_different_global_scales_are_dequantized(tmp_path, registry,
                                                                          caplog):
    q = write_quantized_checkpoint("Qwen3ForCausalLM", tmp_path / "q", "nvfp4_modelopt",
                                   registry=registry)
    name = "model.layers.0.self_attn.k_proj.weight_scale_2"
    _edit(q, lambda t: {**t, name: t[name] * np.float32(2)})
    with caplog.at_level(logging.WARNING):
        model = load_model(q, "numpy", registry=registry, dtype="float32")
    assert "different global scales" in caplog.text
    kept = _kept(model)
    assert len(kept) == 7 and not any("layers.0.self_attn.qkv" in n for n in kept)


def test_nvfp4_weight_without_its_global_scale_is_named(tmp_path, registry):
    q = write_quantized_checkpoint("Qwen3ForCausalLM", tmp_path / "q", "nvfp4_modelopt",
                                   registry=registry)
    name = "model.layers.1.mlp.down_proj.weight_scale_2"
    _edit(q, lambda t: {n: v for n, v in t.items() if n != name})
    with pytest.raises(QuantizedTensorError, match=f"has no {name}"):
        load_model(q, "numpy", registry=registry)


def test_modelopt_mixed_precision_of_fp8_and_nvfp4_layers_loads(tmp_path, registry):
    q = write_quantized_checkpoint("Qwen3ForCausalLM", tmp_path / "q", "nvfp4_modelopt",
                                   registry=registry)
    layers = {"model.layers.0.mlp.down_proj": {"quant_algo": "FP8"},
              "model.layers.1.mlp.down_proj": {"quant_algo": "NVFP4", "group_size": 16}}
    (q / "hf_quant_config.json").write_text(json.dumps({"quantization": {
        "quant_algo": "MIXED_PRECISION", "quantized_layers": layers}}))
    config = json.loads((q / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                                     "quantized_layers": layers}
    (q / "config.json").write_text(json.dumps(config))
    model = load_model(q, "numpy", registry=registry)
    assert {w.format for w in _kept(model).values()} == {"nvfp4"}


def test_serve_states_weight_bytes_and_can_dequantize_at_load(tmp_path, registry):
    from atlas_core.cli import build_parser
    from atlas_core.cli.serve import engine_args
    from atlas_core.engine import LLMEngine
    from atlas_core.model.quantized_loading import weights_line
    q = write_quantized_checkpoint("Qwen3ForCausalLM", tmp_path / "q", "fp8_block",
                                   registry=registry)
    argv = ["serve", str(q), "--backend", "numpy", "--num-kv-blocks", "8"]
    kept = LLMEngine.from_args(engine_args(build_parser().parse_args(argv)))
    line = weights_line(kept.model)
    assert line.startswith("weights: ") and "fp8_block" in line and "bfloat16" in line
    plain = LLMEngine.from_args(engine_args(build_parser().parse_args(
        [*argv, "--dequantize-weights"])))
    assert _kept(kept.model) and not _kept(plain.model)
    assert "fp8_block" not in weights_line(plain.model)


def test_size_check_counts_the_quantized_bytes(tmp_path, registry):
    """An NVFP4 model whose bf16 size exceeds the device but whose checkpoint fits loads; the
    same device refuses it when the weights would be dequantized."""
    from atlas_core.interfaces import DeviceInfo
    from atlas_core.model.weight_loading import WeightLoadError
    q = write_quantized_checkpoint("Qwen3MoeForCausalLM", tmp_path / "q", "nvfp4_modelopt",
                                   registry=registry)
    backend = registry.create("gpu_backends", "numpy")
    size = Checkpoint.open(q).nbytes
    backend.device_info = lambda: DeviceInfo(name="a small device", kind="cpu",
                                             total_memory=size + 1024)
    assert _kept(load_model(q, backend, registry=registry))
    backend.quantized_weight_formats = frozenset()
    with pytest.raises(WeightLoadError, match="of bfloat16 weights, more than"):
        load_model(q, backend, registry=registry)
    # a backend that could keep them (cuda with quant_weights off) says how
    backend.keep_quantized_hint = "set KEEP=1 to keep them"
    with pytest.raises(WeightLoadError, match=r"of bfloat16 weights, more than .*: the checkpoint "
                                              r"is quantized \(.*\) but is being dequantized at "
                                              r"load; set KEEP=1 to keep them"):
        load_model(q, backend, registry=registry)


def test_a_checkpoint_that_fits_only_quantized_is_kept_quantized(tmp_path, registry, caplog):
    """A backend that dequantizes by default but can keep the format (cuda without
    ATLAS_CUDA_QUANT_WEIGHTS) keeps an NVFP4 checkpoint quantized when dequantized it would not
    fit, with a warning; a fitting one stays dequantized; --dequantize-weights still refuses."""
    from atlas_core.interfaces import DeviceInfo
    from atlas_core.model.quantized_loading import dequantize_all
    from atlas_core.model.weight_loading import WeightLoadError
    q = write_quantized_checkpoint("Qwen3MoeForCausalLM", tmp_path / "q", "nvfp4_modelopt",
                                   registry=registry)
    size = Checkpoint.open(q).nbytes

    def backend_of(total: int):
        backend = registry.create("gpu_backends", "numpy")
        formats, backend.quantized_weight_formats = backend.quantized_weight_formats, frozenset()
        backend.keep_quantized_hint = "set KEEP=1 to keep them"
        backend.asked = 0

        def keep() -> bool:
            backend.asked += 1
            backend.quantized_weight_formats = formats
            return True
        backend.keep_quantized = keep
        backend.device_info = lambda: DeviceInfo(name="a small device", kind="cpu",
                                                 total_memory=total)
        return backend

    small = backend_of(size + 1024)
    with caplog.at_level("WARNING", logger="atlas_core.model.quantized_loading"):
        assert _kept(load_model(q, small, registry=registry))
    assert small.asked == 1
    assert "keeping them quantized" in caplog.text and "a small device" in caplog.text
    large = backend_of(1 << 40)
    assert not _kept(load_model(q, large, registry=registry)) and large.asked == 0
    refused = backend_of(size + 1024)
    dequantize_all(refused)
    with pytest.raises(WeightLoadError, match="being dequantized at load; set KEEP=1"):
        load_model(q, refused, registry=registry)
    assert refused.asked == 0
    tiny = backend_of(size // 2)  # fits neither way: the plain size error
    with pytest.raises(WeightLoadError, match="use a smaller model"):
        load_model(q, tiny, registry=registry)
    assert tiny.asked == 0


def test_an_fp8_scale_of_no_known_layout_fails_before_allocating(tmp_path, registry):
    q = write_quantized_checkpoint("Qwen3ForCausalLM", tmp_path / "q", "fp8_block",
                                   registry=registry)
    name = "model.layers.1.self_attn.o_proj.weight_scale_inv"
    _edit(q, lambda t: {**t, name: np.ones((7, 3), np.float32)})
    from atlas_core.model.weight_loading import WeightLoadError
    with pytest.raises(WeightLoadError, match=rf"{name} has shape \[7, 3\] .* nor 16x16 blocks "
                                              r"\[4, 4\]; if the blocks differ"):
        load_model(q, "numpy", registry=registry)


def test_modelopt_checkpoint_with_only_hf_quant_config_loads(tmp_path, registry):
    """Older ModelOpt exports describe the quantization in hf_quant_config.json alone: the
    tensors say the rest."""
    q = write_quantized_checkpoint("Qwen3ForCausalLM", tmp_path / "q", "nvfp4_modelopt",
                                   reference=tmp_path / "ref", registry=registry)
    config = json.loads((q / "config.json").read_text())
    del config["quantization_config"]
    (q / "config.json").write_text(json.dumps(config))
    model = load_model(q, "numpy", registry=registry, dtype="float32")
    assert len(_kept(model)) == 8
    reference = load_model(tmp_path / "ref", "numpy", registry=registry, dtype="float32")
    np.testing.assert_array_equal(_run(model), _run(reference))


def test_ue8m0_scales_stored_as_float8_e8m0_are_powers_of_two(tmp_path):
    from atlas_core.model.weight_loading import read_tensor
    rng = np.random.default_rng(0)
    exponents = rng.integers(-6, 3, (2, 3)).astype(np.float32)
    scale = np.exp2(exponents).astype(ml_dtypes.float8_e8m0fnu)
    data = rng.standard_normal((32, 48)).astype(ml_dtypes.float8_e4m3fn)
    write_safetensors(tmp_path / "m.safetensors", {"w.weight": data, "w.weight_scale_inv": scale})
    got = read_tensor(Checkpoint.open(tmp_path), "w.weight", np.dtype(np.float32), (16, 16))
    want = data.astype(np.float32) * np.kron(np.exp2(exponents), np.ones((16, 16)))
    np.testing.assert_array_equal(got, want)
