"""The mmap safetensors reader: dtypes, sharded checkpoints, truncated and corrupt files."""

import json

import ml_dtypes
import numpy as np
import pytest

from atlas_core.weights import Checkpoint, CheckpointError, SafetensorsFile, write_safetensors

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, np.int64, np.int32,
          np.uint8, np.bool_]


def _tensors():
    rng = np.random.default_rng(0)
    out = {}
    for i, dt in enumerate(DTYPES):
        data = rng.standard_normal((3, 5)) * 4
        out[f"t{i}.{np.dtype(dt).name}"] = (data > 0) if dt is np.bool_ else data.astype(dt)
    out["scalar"] = np.array(2.5, dtype=np.float32)
    out["empty"] = np.zeros((0, 4), dtype=np.float32)
    return out


def test_roundtrip_every_dtype(tmp_path):
    tensors = _tensors()
    write_safetensors(tmp_path / "model.safetensors", tensors, {"format": "pt"})
    ckpt = Checkpoint.open(tmp_path)
    assert ckpt.names() == list(tensors)
    for name, want in tensors.items():
        assert name in ckpt
        assert ckpt.shape(name) == want.shape and ckpt.dtype(name) == want.dtype
        got = ckpt.get(name)
        assert got.dtype == want.dtype and not got.flags.writeable
        assert got.tobytes() == want.tobytes()
    assert "missing" not in ckpt
    assert ckpt.files["model.safetensors"].metadata == {"format": "pt"}


def test_reads_files_written_by_the_safetensors_package(tmp_path):
    from safetensors.numpy import save_file
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    save_file({"a": a, "b": a.astype(np.float16)}, str(tmp_path / "x.safetensors"))
    ckpt = Checkpoint.open(tmp_path / "x.safetensors")
    np.testing.assert_array_equal(ckpt.get("a"), a)
    np.testing.assert_array_equal(ckpt.get("b"), a.astype(np.float16))


def _write_sharded(tmp_path):
    a, b = np.ones((2, 2), np.float32), np.full((3,), 7, np.int32)
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": a})
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"b": b})
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    return a, b


def test_sharded_checkpoint(tmp_path):
    a, b = _write_sharded(tmp_path)
    ckpt = Checkpoint.open(tmp_path)
    assert sorted(ckpt.names()) == ["a", "b"] and len(ckpt) == 2
    np.testing.assert_array_equal(ckpt.get("b"), b)
    assert ckpt.file_of("a").name == "model-00001-of-00002.safetensors"
    assert ckpt.nbytes == a.nbytes + b.nbytes


def test_missing_shard(tmp_path):
    _write_sharded(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="shard 'model-00002-of-00002.safetensors' is missing"):
        Checkpoint.open(tmp_path)


def test_index_naming_a_tensor_the_shard_lacks(tmp_path):
    _write_sharded(tmp_path)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"]["c"] = "model-00001-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="tensor 'c' listed in"):
        Checkpoint.open(tmp_path)


def test_bad_index_json(tmp_path):
    _write_sharded(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("{nope")
    with pytest.raises(CheckpointError, match="not a valid safetensors index"):
        Checkpoint.open(tmp_path)


def test_no_safetensors(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="no \\*.safetensors files"):
        Checkpoint.open(tmp_path)
    with pytest.raises(CheckpointError, match="no such file"):
        Checkpoint.open(tmp_path / "absent")


@pytest.fixture
def good_file(tmp_path):
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"w": np.arange(64, dtype=np.float32).reshape(8, 8)})
    return path


def _corrupt(path, data):
    path.write_bytes(data)
    with pytest.raises(CheckpointError) as info:
        SafetensorsFile(path)
    assert str(path) in str(info.value)
    return str(info.value)


def test_truncated_data(good_file):
    data = good_file.read_bytes()
    assert "past the end of the file" in _corrupt(good_file, data[:-10])


def test_shorter_than_header_length(good_file):
    assert "shorter than the 8-byte header length" in _corrupt(good_file, b"\x01\x02")
    assert "shorter than the 8-byte header length" in _corrupt(good_file, b"")


def test_bad_header_length(good_file):
    data = good_file.read_bytes()
    assert "bad header length" in _corrupt(good_file, (10**12).to_bytes(8, "little") + data[8:])


def test_bad_json(good_file):
    data = good_file.read_bytes()
    n = int.from_bytes(data[:8], "little")
    assert "not valid JSON" in _corrupt(good_file, data[:8] + b"{" * n + data[8 + n:])
    assert "not a JSON object" in _corrupt(good_file, (2).to_bytes(8, "little") + b"[]")


def test_malformed_entries(good_file):
    def header(entry):
        raw = json.dumps({"w": entry}).encode()
        return len(raw).to_bytes(8, "little") + raw + bytes(256)
    assert "malformed header entry" in _corrupt(good_file, header({"dtype": "F32"}))
    bad = {"dtype": "F32", "shape": [4], "data_offsets": [8, 0]}
    assert "invalid shape" in _corrupt(good_file, header(bad))
    bad = {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}
    assert "do not hold F32 [4]" in _corrupt(good_file, header(bad))


def test_unknown_dtype_fails_on_use(good_file):
    raw = json.dumps({"w": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}).encode()
    good_file.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(8))
    f = SafetensorsFile(good_file)
    with pytest.raises(CheckpointError, match="unsupported dtype C64"):
        f.get("w")
