"""`atlas bench` on the numpy backend with a tiny shape, the roofline arithmetic, `atlas doctor`."""

import json

import pytest

from atlas_core.bench.shapes import SHAPES, shape_config, step_bytes
from atlas_core.cli import main


def test_step_bytes_of_named_shapes():
    # Qwen3-8B is 8.19B parameters; a decode step reads all but the embedding table (one row):
    # ~7.57B parameters, 15.1 GB of bf16.
    assert 15.0e9 < step_bytes(SHAPES["qwen3-8b"], 0) < 15.3e9
    assert 1.1e9 < step_bytes(SHAPES["qwen3-0.6b"], 0) < 1.3e9
    # 30B-A3B touches ~3.3B parameters at batch 1, all 128 experts at large batch.
    assert 5.8e9 < step_bytes(SHAPES["qwen3-30b-a3b"], 0) < 6.5e9
    assert step_bytes(SHAPES["qwen3-30b-a3b"], 0, batch=64) > 55e9
    assert step_bytes(SHAPES["qwen3-8b"], 1000) > step_bytes(SHAPES["qwen3-8b"], 0)


def test_unknown_shape_is_a_clear_error():
    with pytest.raises(KeyError, match="known: qwen3-0.6b"):
        shape_config("qwen9")


def test_bench_tiny_on_numpy(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATLAS_CACHE_DIR", str(tmp_path))
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", "tiny", "--backend", "numpy", "--prompt-len", "32",
                 "--decode-tokens", "8", "--concurrency", "1,2", "--copy-mb", "1",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["backend"] == "numpy"
    assert [(c["batch"], c["context"]) for c in result["cells"]] == [(1, 32), (2, 32)]
    assert all(c["tok_s"] > 0 and c["floor_tok_s"] > 0 and c["ttft_s"] > 0
               for c in result["cells"])
    assert "% floor" in capsys.readouterr().out


def test_bench_rejects_missing_model_dir(tmp_path, capsys):
    assert main(["bench", "--model", str(tmp_path / "nope")]) == 2
    assert "neither a named shape" in capsys.readouterr().err


def test_doctor_runs_without_gpu(capsys):
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert "atlas" in text and "plugin" in text


def test_reduced_shapes_state_their_layers_and_per_layer_bytes():
    """Issues #24 / #25: a shape cut to fit one GPU says so, with what a layer costs a step."""
    from atlas_core.bench.shapes import shape_note
    assert shape_note("minimax-m2", SHAPES["minimax-m2"]).startswith(
        "shape minimax-m2: 5 layers of the released model's 62 (cut to fit one GPU in bf16); ")
    assert "1.169 GB a layer (mean)" in shape_note("deepseek-v3", SHAPES["deepseek-v3"])
    assert "of the released" not in shape_note("qwen3-8b", SHAPES["qwen3-8b"])
    assert shape_note("my-checkpoint", SHAPES["qwen3-8b"]) == ""


def test_report_prints_the_shape_and_kv_lines():
    from types import SimpleNamespace

    from atlas_core.bench import report
    from atlas_core.bench.runner import BenchResult, kv_note
    kv = SimpleNamespace(bytes_per_block=16 * 3456, block_size=16, window_pool=None)
    result = BenchResult("deepseek-v3", "cuda", "H200", shape="shape deepseek-v3: 3 layers",
                         kv=kv_note(kv))
    text = report.to_text(result)
    assert "shape deepseek-v3: 3 layers" in text
    assert "KV cache: 3,456 bytes a token of context over the paged layers" in text
    assert kv_note(None) == "" and "window apart" in kv_note(
        SimpleNamespace(bytes_per_block=64, block_size=16, window_pool=object()))
