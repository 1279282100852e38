"""Batch 1's decode graphs over narrower block tables (``decode_graphs.NARROW_WIDTHS``): a
sequence replays the narrowest graph its keys fit, then moves on to wider ones and the full
graph as it grows, with the same tokens as numpy's eager steps; a batch of more stays on the
full graphs; ``ATLAS_DECODE_GRAPH_WIDTHS`` picks the widths (mock backend: real graphs' code
path, numpy arithmetic)."""

import pytest

from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
from atlas_core.engine.decode_graphs import NARROW_WIDTHS_ENV, narrow_widths
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.fake_model import run_to_completion

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path_factory.mktemp("qwen3"))


def make_engine(model_dir, backend, **kwargs):
    return LLMEngine.from_args(EngineArgs(model=str(model_dir), backend=backend, num_kv_blocks=64,
                                          max_num_seqs=4, max_seq_len=128, block_size=16,
                                          **kwargs))


def test_widths_are_whole_blocks_below_the_longest_sequence(monkeypatch):
    monkeypatch.delenv(NARROW_WIDTHS_ENV, raising=False)
    assert narrow_widths(40960, 16) == [4096, 16384]
    assert narrow_widths(8192, 16) == [4096] and narrow_widths(4096, 16) == []
    monkeypatch.setenv(NARROW_WIDTHS_ENV, "40,16")
    assert narrow_widths(128, 16) == [16, 48]
    monkeypatch.setenv(NARROW_WIDTHS_ENV, "0")
    assert narrow_widths(40960, 16) == []
    monkeypatch.setenv(NARROW_WIDTHS_ENV, "4k")
    with pytest.raises(ValueError, match="ATLAS_DECODE_GRAPH_WIDTHS='4k': give token counts"):
        narrow_widths(40960, 16)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_batch_one_moves_from_narrow_to_full_graphs_with_numpy_tokens(model_dir, monkeypatch,
                                                                      async_scheduling):
    monkeypatch.setenv(NARROW_WIDTHS_ENV, "16,48")
    prompt, n = [5, 17, 33, 9, 2, 11], 70           # keys 7 .. 75: widths 16, 48, then full
    got = {}
    for backend in ("mock", "numpy"):
        engine = make_engine(model_dir, backend, **({"async_scheduling": async_scheduling}
                                                     if backend == "mock" else {}))
        for i, params in enumerate((dict(temperature=0.0), dict(temperature=0.9, seed=3))):
            engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=n, ignore_eos=True,
                                                               **params))
            got[backend, i] = run_to_completion(engine)[f"r{i}"].outputs[0].token_ids
        if backend == "mock":
            runner = engine.runner
            assert sorted(runner.narrow_graphs) == [16, 48]
            assert set(runner.graphs) == {1}
            # steps with 7..16 and 17..48 keys narrow, 49..75 the full graph, twice
            assert runner.num_narrow_replays == 2 * (16 - 7 + 1 + 48 - 17 + 1)
            assert runner.num_graph_replays - runner.num_narrow_replays == 2 * (75 - 49 + 1)
            assert not engine.has_unfinished_requests()
    assert got["mock", 0] == got["numpy", 0] and got["mock", 1] == got["numpy", 1]
    assert len(got["mock", 0]) == n


def test_a_batch_of_two_replays_the_full_graphs_only(model_dir, monkeypatch):
    monkeypatch.setenv(NARROW_WIDTHS_ENV, "16,48")
    engine = make_engine(model_dir, "mock", async_scheduling=False)
    for i in range(2):
        engine.add_request(f"r{i}", [5 + i, 17, 33], SamplingParams(max_tokens=8,
                                                                     ignore_eos=True))
    run_to_completion(engine)
    assert engine.runner.num_graph_replays > 0 and engine.runner.num_narrow_replays == 0
    assert engine.runner.narrow_graphs == {}


def test_without_graphs_there_are_no_narrow_tables(model_dir, monkeypatch):
    monkeypatch.setenv(NARROW_WIDTHS_ENV, "16,48")
    engine = make_engine(model_dir, "numpy")
    assert engine.runner.narrow_tables == {} and engine.runner.narrow_graphs == {}
