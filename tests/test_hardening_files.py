"""Files that lie (issue #30): overlapping safetensors ranges, absurd config.json sizes,
quantized formats Atlas cannot load yet, and FP8 scales of every layout."""

from __future__ import annotations

import json
import shutil
import struct
import time

import ml_dtypes
import numpy as np
import pytest

from atlas_core.interfaces.gpu_backend import DeviceInfo
from atlas_core.model import load_model
from atlas_core.model.weight_loading import WeightLoadError, fp8_block_size, read_tensor
from atlas_core.plugins import Registry, make_plugin_manager
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.weights import (Checkpoint, CheckpointError, SafetensorsFile,
                                UnsupportedQuantizationError, write_safetensors)

FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


@pytest.fixture(scope="module")
def registry():
    return Registry(make_plugin_manager(allow=["qwen3"]))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, registry):
    return write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path_factory.mktemp("tiny"),
                                 dtype="float32", registry=registry)


def _copy(src, dst, edit_config=None, edit_tensors=None):
    shutil.copytree(src, dst)
    if edit_config is not None:
        config = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps(edit_config(config)))
    if edit_tensors is not None:
        ckpt = Checkpoint.open(src)
        tensors = edit_tensors({n: np.array(ckpt.get(n)) for n in ckpt.names()})
        write_safetensors(dst / "model.safetensors", tensors)
    return dst


def _raw_safetensors(path, header: dict, data: bytes):
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_overlapping_tensor_ranges_are_rejected(tmp_path):
    header = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
              "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}
    path = _raw_safetensors(tmp_path / "x.safetensors", header, bytes(24))
    with pytest.raises(CheckpointError, match=r"'a' \(data bytes 0-16\) and 'b' .* overlap"):
        SafetensorsFile(path)
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    with pytest.raises(Exception):
        safetensors_numpy.load_file(str(path))


def test_adjacent_and_empty_tensors_are_not_overlaps(tmp_path):
    header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "e": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}
    path = _raw_safetensors(tmp_path / "x.safetensors", header, bytes(16))
    assert set(SafetensorsFile(path).tensors) == {"a", "e", "b"}


def test_absurd_layer_count_fails_fast_with_the_memory_needed(tiny, tmp_path, registry):
    path = _copy(tiny, tmp_path / "m", lambda c: {**c, "num_hidden_layers": 1_000_000})
    start = time.perf_counter()
    with pytest.raises(WeightLoadError) as exc:
        load_model(path, "numpy", registry=registry)
    elapsed = time.perf_counter() - start
    assert elapsed < 5, f"took {elapsed:.1f} s"
    message = str(exc.value)
    attention = 4 * 16 * 64 * 2 + 2 * 16 * 64 * 2 + 2 * 16
    per_layer = attention + 3 * 64 * 128 + 2 * 64
    assert per_layer == 37_024
    assert "config.json describes a model of 37.02B parameters, 137.9 GiB" in message
    assert "GiB of float32 weights" in message and "does not match the checkpoint" in message


def test_model_larger_than_the_device_is_refused_before_building(tiny, registry):
    backend = registry.create("gpu_backends", "numpy")
    backend.device_info = lambda: DeviceInfo(name="a small test device", kind="cpu",
                                             total_memory=2**18)
    with pytest.raises(WeightLoadError, match=r"0\.12M parameters, 0\.47 MiB of float32 weights, "
                                              r"more than the 0\.25 MiB of a small test device"):
        load_model(tiny, backend, registry=registry)


QUANT_CONFIGS = [
    ({"quant_method": "awq", "bits": 4}, "AWQ"),
    ({"quant_method": "gptq", "bits": 4}, "GPTQ"),
    ({"quant_method": "mxfp4"}, "MXFP4"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes 4-bit"),
    ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, "W4A8-AWQ"),
    ({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "model.layers.0.mlp.down_proj": {"quant_algo": "INT4_AWQ"}}},
     "MIXED_PRECISION with INT4-AWQ layers"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}}},
     "compressed-tensors int4"),
]


@pytest.mark.parametrize("quant, name", QUANT_CONFIGS)
def test_unsupported_quantization_config_is_named(tiny, tmp_path, registry, quant, name):
    path = _copy(tiny, tmp_path / "q", lambda c: {**c, "quantization_config": quant})
    with pytest.raises(UnsupportedQuantizationError, match=f"quantized as {name}.*cannot load"):
        load_model(path, "numpy", registry=registry)


@pytest.mark.parametrize("suffix, name", [(".qweight", "GPTQ/AWQ"), (".weight_packed",
                                          "compressed-tensors packed")])
def test_quantized_tensor_names_are_named(tiny, tmp_path, registry, suffix, name):
    extra = "model.layers.0.mlp.down_proj" + suffix
    path = _copy(tiny, tmp_path / "q", edit_tensors=lambda t: {**t, extra: np.zeros(4, np.int32)})
    with pytest.raises(UnsupportedQuantizationError, match=f"quantized as {name}.*{extra}"):
        load_model(path, "numpy", registry=registry)


def test_modelopt_hf_quant_config_is_read(tiny, tmp_path, registry):
    path = _copy(tiny, tmp_path / "q")
    (path / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "W4A8_AWQ"}}))
    with pytest.raises(UnsupportedQuantizationError, match="W4A8-AWQ .from hf_quant_config.json"):
        load_model(path, "numpy", registry=registry)


def test_gguf_is_named(tmp_path, registry):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    (tmp_path / "model-Q4_K_M.gguf").write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(UnsupportedQuantizationError, match="GGUF files .* are not supported"):
        Checkpoint.open(tmp_path)
    with pytest.raises(FileNotFoundError, match="is a GGUF file"):
        load_model(tmp_path / "model-Q4_K_M.gguf", "numpy", registry=registry)


def _fp8(w, scale):
    return (w / scale).astype(FP8)


def _reference(q, scale, block=None):
    """Dequantize by looping over blocks: an independent statement of the layout."""
    w = q.astype(np.float32)
    if block is None:
        return w * scale
    out = np.empty_like(w)
    bo, bi = block
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            out[i * bo:(i + 1) * bo, j * bi:(j + 1) * bi] = (
                w[i * bo:(i + 1) * bo, j * bi:(j + 1) * bi] * scale[i, j])
    return out


def _scales(rng, shape):
    return rng.uniform(0.01, 0.1, shape).astype(np.float32)


@pytest.mark.parametrize("layout", ["tensor", "tensor-1d", "channel", "channel-1d", "block",
                                    "experts-channel"])
def test_fp8_scales_match_numpy_dequantization(tmp_path, layout):
    rng = np.random.default_rng(0)
    shape = (3, 200, 136) if layout.startswith("experts") else (200, 136)
    w = rng.standard_normal(shape).astype(np.float32)
    block = None
    scale = {"tensor": lambda: np.float32(0.05).reshape(()),
             "tensor-1d": lambda: np.full((1,), 0.05, np.float32),
             "channel": lambda: _scales(rng, (200, 1)),
             "channel-1d": lambda: _scales(rng, (200,)),
             "block": lambda: _scales(rng, (2, 2)),
             "experts-channel": lambda: _scales(rng, (3, 200, 1))}[layout]()
    if layout == "block":
        block = (128, 128)
        q = (w / np.repeat(np.repeat(scale, 128, 0), 128, 1)[:200, :136]).astype(FP8)
        want = _reference(q, scale, block)
    else:
        broadcast = scale.reshape(200, 1) if layout == "channel-1d" else scale
        q = _fp8(w, broadcast)
        want = _reference(q, broadcast)
    write_safetensors(tmp_path / "m.safetensors", {"w.weight": q, "w.weight_scale": scale})
    got = read_tensor(Checkpoint.open(tmp_path), "w.weight", np.dtype(np.float32))
    np.testing.assert_array_equal(got, want)


def test_fp8_block_shape_comes_from_the_config(tmp_path):
    quant = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {
        "num_bits": 8, "type": "float", "strategy": "block", "block_structure": [32, 64]}}}}
    block = fp8_block_size({"quantization_config": quant})
    assert block == (32, 64)
    rng = np.random.default_rng(1)
    scale = _scales(rng, (3, 2))
    q = rng.standard_normal((96, 128)).astype(FP8)
    write_safetensors(tmp_path / "m.safetensors", {"w.weight": q, "w.weight_scale_inv": scale})
    got = read_tensor(Checkpoint.open(tmp_path), "w.weight", np.dtype(np.float32), block)
    np.testing.assert_array_equal(got, _reference(q, scale, block))


def test_fp8_scale_of_no_known_layout_is_an_error(tmp_path):
    write_safetensors(tmp_path / "m.safetensors", {"w.weight": np.zeros((64, 64), FP8),
                                                   "w.weight_scale": np.ones((7, 3), np.float32)})
    with pytest.raises(WeightLoadError, match=r"w.weight_scale has shape \[7, 3\].*per-channel "
                                              r"\[64, 1\] nor 128x128 blocks \[1, 1\]"):
        read_tensor(Checkpoint.open(tmp_path), "w.weight", np.dtype(np.float32))


def test_per_channel_fp8_checkpoint_gives_the_dequantized_model(tiny, tmp_path, registry):
    """compressed-tensors FP8 with ``weight_scale`` [out, 1]: the same logits as a float32
    checkpoint holding the dequantized weights (every 2-D scale used to be read as blocks)."""
    fp8, ref = {}, {}
    ckpt = Checkpoint.open(tiny)
    for name in ckpt.names():
        w = np.array(ckpt.get(name))
        if ".layers." in name and name.endswith("proj.weight"):
            scale = (np.abs(w).max(axis=1, keepdims=True) / 448).astype(np.float32)
            fp8[name], fp8[name + "_scale"] = _fp8(w, scale), scale
            ref[name] = fp8[name].astype(np.float32) * scale
        else:
            fp8[name] = ref[name] = w
    quant = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {
        "group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}
    a = _copy(tiny, tmp_path / "fp8", lambda c: {**c, "quantization_config": quant},
              lambda _: fp8)
    b = _copy(tiny, tmp_path / "ref", edit_tensors=lambda _: ref)
    from atlas_core.testing.forward import ForwardRunner
    logits = []
    for path in (a, b):
        model = load_model(path, "numpy", registry=registry, dtype="float32")
        runner = ForwardRunner(model, model.backend, max_seq_len=32)
        logits.append(runner.step([[5, 9, 200, 31, 7]], all_logits=True)[0])
    np.testing.assert_array_equal(logits[0], logits[1])
