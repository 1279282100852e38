"""Batch 1's decode graphs over narrower block tables on CUDA (core's
``decode_graphs.NARROW_WIDTHS``): a sequence that crosses every width decodes the same tokens as
with the full-width graph only, with the overlap on and off."""

import pytest

from cuda_probe import HAS_GPU

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")]

NARROW_WIDTHS_ENV = "ATLAS_DECODE_GRAPH_WIDTHS"  # atlas_core.engine.decode_graphs


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    from atlas_core.testing.checkpoints import write_tiny_checkpoint
    return write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path_factory.mktemp("narrow"))


def _run(path, async_scheduling):
    from atlas_core.api import EngineArgs, LLMEngine, SamplingParams
    from atlas_core.testing.fake_model import run_to_completion

    engine = LLMEngine.from_args(EngineArgs(model=str(path), backend="cuda", num_kv_blocks=64,
                                            max_num_seqs=4, max_seq_len=128, block_size=16,
                                            async_scheduling=async_scheduling))
    out = {}
    for i, params in enumerate((dict(temperature=0.0), dict(temperature=0.9, seed=3))):
        engine.add_request(f"r{i}", [5, 17, 33, 9, 2, 11], SamplingParams(
            max_tokens=70, ignore_eos=True, **params))
        out[i] = run_to_completion(engine)[f"r{i}"].outputs[0].token_ids
    assert engine.block_manager.num_used_blocks == 0
    return out, engine.runner.num_narrow_replays


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_narrow_graphs_decode_the_full_graphs_tokens(path, monkeypatch, async_scheduling):
    monkeypatch.setenv(NARROW_WIDTHS_ENV, "0")
    want, none = _run(path, async_scheduling)
    monkeypatch.setenv(NARROW_WIDTHS_ENV, "16,48")
    got, narrow = _run(path, async_scheduling)
    assert none == 0 and narrow == 84          # keys 7..16 and 17..48, two requests
    assert got == want
