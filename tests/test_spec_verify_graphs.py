"""Speculative verify steps replayed from graphs (issue #27), on the mock backend whose graphs
run the captured code again: verify steps take the graph path (buckets, padding to ``K + 1``
rows a sequence), give the tokens of the eager verify path and of plain decoding, and free
every KV block."""

import numpy as np
import pytest

from atlas_core.backends.mock_backend import MockGpuBackend
from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.fake_model import run_to_completion
from atlas_core.testing.frozen_graphs import FrozenGraphBackend
from atlas_core.testing.spec_drafts import ScriptedProposer

pytestmark = pytest.mark.timeout(180)

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "draft_token_cost": 0.0,
        "disable_by_batch_size": 4, "verify_graphs": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path_factory.mktemp("qwen3vg"))


def make_engine(model_dir, spec=None, graphs=True, **kwargs):
    kwargs = {"num_kv_blocks": 64, "max_num_seqs": 4, "block_size": 8,
              "async_scheduling": False, **kwargs}
    args = EngineArgs(model=str(model_dir), speculative_config=spec, **kwargs)
    if graphs:
        return LLMEngine.from_args(args, backend=MockGpuBackend())
    return LLMEngine.from_args(EngineArgs(**{**vars(args), "backend": "numpy"}))


def prompts(n=3):
    rng = np.random.default_rng(5)
    return [rng.integers(0, 370, 4 + 5 * i).tolist() for i in range(n)]


def run(engine, ps, params, plain=None, wrong_rate=0.35, max_drafts=None):
    if plain is not None:
        proposer = ScriptedProposer({rid: out.outputs[0].token_ids for rid, out in plain.items()},
                                    engine.model.vocab_size, wrong_rate, seed=7)
        if max_drafts is not None:  # fewer drafts than K for some sequences: padded rows
            inner = proposer.propose
            proposer.propose = lambda seq, k: inner(seq, min(k, max_drafts(seq)))
        engine.speculator.proposer = proposer
    for i, p in enumerate(ps):
        engine.add_request(f"r{i}", p, params)
    return run_to_completion(engine)


def tokens(outs):
    return {rid: out.outputs[0].token_ids for rid, out in outs.items()}


@pytest.mark.parametrize("wrong_rate", [0.0, 0.35, 1.0])
def test_verify_graphs_match_eager_and_plain(model_dir, wrong_rate):
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    ps = prompts()
    plain = run(make_engine(model_dir, graphs=False), ps, params)
    eager = make_engine(model_dir, SPEC, graphs=False)
    eager_out = run(eager, ps, params, plain, wrong_rate)
    graph = make_engine(model_dir, SPEC)
    # Mixed draft counts in one batch: sequence r0 drafts K, r1 at most 1, r2 at most 2.
    cap = {0: 3, 1: 1, 2: 2}
    graph_out = run(graph, ps, params, plain, wrong_rate,
                    max_drafts=lambda seq: cap[int(seq.request_id[1:])]
                    if hasattr(seq, "request_id") else 3)
    assert tokens(eager_out) == tokens(plain) == tokens(graph_out)
    r = graph.runner
    assert r.num_verify_replays > 0 and eager.runner.num_verify_replays == 0
    assert graph.stats().speculative.num_draft_tokens > 0
    assert {k[1] for k in r.verify.graphs} == {4}
    assert graph.block_manager.num_free_blocks == graph.block_manager.num_blocks


def test_verify_replay_is_static(model_dir):
    """A verify step launches only the graph: no op outside it, no allocation, one sync."""
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    ps = prompts(2)
    plain = run(make_engine(model_dir, graphs=False), ps, params)
    engine = make_engine(model_dir, SPEC)
    engine.speculator.proposer = ScriptedProposer(tokens(plain), engine.model.vocab_size, 0.0)
    for i, p in enumerate(ps):
        engine.add_request(f"r{i}", p, params)
    engine.step()
    backend, seen = engine.backend, 0
    while engine.has_unfinished_requests():
        before = engine.runner.num_verify_replays
        with backend.record() as rec:
            engine.step()
        if engine.runner.num_verify_replays > before and rec.count("capture") == 0:
            seen += 1
            assert rec.count("graph_launch") == 1
            assert rec.count("launch") == 0, rec.names("launch")
            assert rec.count("alloc") == 0, rec.names("alloc")
            assert rec.count("d2h") == 1
    assert seen > 0


def test_padding_buckets_and_warm_up(model_dir):
    """A batch of 3 takes the 4-bucket; the warm-up flag captures every bucket on the next step."""
    engine = make_engine(model_dir, SPEC)
    runner = engine.runner
    assert runner.verify is not None and runner.verify.buckets() == [1, 2, 4]
    runner.warm_verify_graphs()
    engine.add_request("w", prompts(1)[0], SamplingParams(temperature=0, max_tokens=2))
    run_to_completion(engine)
    assert sorted(runner.verify.graphs) == [(1, 4), (2, 4), (4, 4)]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_verify_graphs_replay_as_cuda_does(model_dir):
    """Decode and verify graphs replayed as CUDA replays them (issue #27): the op calls
    recorded at capture on their recorded buffers, with no captured function kept alive
    (the mock re-runs the step's Python at every replay); greedy tokens equal plain decoding,
    padded rows included."""
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    ps = prompts()
    plain = run(make_engine(model_dir, graphs=False), ps, params)
    args = EngineArgs(model=str(model_dir), speculative_config=SPEC, num_kv_blocks=64,
                      max_num_seqs=4, block_size=8, async_scheduling=False)
    engine = LLMEngine.from_args(args, backend=FrozenGraphBackend())
    cap = {0: 3, 1: 1, 2: 2}
    out = run(engine, ps, params, plain, 0.35,
              max_drafts=lambda seq: cap[int(seq.request_id[1:])])
    assert tokens(out) == tokens(plain)
    assert engine.runner.num_verify_replays > 0
    assert engine.runner.num_graph_replays > engine.runner.num_verify_replays
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
