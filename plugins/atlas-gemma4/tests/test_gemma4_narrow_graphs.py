"""Batch 1's narrow decode graphs (core's ``decode_graphs.NARROW_WIDTHS``) on a model with a sliding-window
KV pool: the window tables are cut to each graph's width as the full-attention tables are, and
a sequence that crosses every width decodes numpy's tokens (mock backend: real graphs' code
path, numpy arithmetic)."""

import pytest

from atlas_core.api import EngineArgs, LLMEngine, SamplingParams
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.fake_model import run_to_completion

pytestmark = pytest.mark.timeout(180)

NARROW_WIDTHS_ENV = "ATLAS_DECODE_GRAPH_WIDTHS"  # atlas_core.engine.decode_graphs


def test_window_tables_follow_the_narrow_graphs(tmp_path, monkeypatch):
    monkeypatch.setenv(NARROW_WIDTHS_ENV, "16,48")
    model_dir = write_tiny_checkpoint("Gemma4ForCausalLM", tmp_path, sliding_window=16)
    got = {}
    for backend in ("mock", "numpy"):
        engine = LLMEngine.from_args(EngineArgs(model=str(model_dir), backend=backend,
                                                num_kv_blocks=64, max_num_seqs=4,
                                                max_seq_len=128, block_size=16))
        assert engine.runner.windowed
        engine.add_request("r", [5, 17, 33, 9, 2, 11], SamplingParams(
            max_tokens=70, ignore_eos=True, temperature=0))
        got[backend] = run_to_completion(engine)["r"].outputs[0].token_ids
    assert got["mock"] == got["numpy"] and len(got["mock"]) == 70


def test_the_mock_engine_replays_the_narrow_graphs(tmp_path, monkeypatch):
    monkeypatch.setenv(NARROW_WIDTHS_ENV, "16,48")
    model_dir = write_tiny_checkpoint("Gemma4ForCausalLM", tmp_path, sliding_window=16)
    engine = LLMEngine.from_args(EngineArgs(model=str(model_dir), backend="mock",
                                            num_kv_blocks=64, max_num_seqs=4, max_seq_len=128,
                                            block_size=16))
    engine.add_request("r", [5, 17, 33, 9, 2, 11], SamplingParams(max_tokens=70,
                                                                   ignore_eos=True))
    run_to_completion(engine)
    assert sorted(engine.runner.narrow_graphs) == [16, 48]
    assert engine.runner.num_narrow_replays == 42 and engine.runner.num_graph_replays == 69
