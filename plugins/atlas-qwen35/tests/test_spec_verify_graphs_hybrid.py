"""Graph-captured speculative verify steps on tiny hybrid checkpoints (numpy graphs that run
the step at capture, as cuda's do): Gated DeltaNet per-position state rows come from device
buffers, padding entries write nothing, and greedy tokens equal plain decoding and the eager
verify path; every state slot and KV block is free at the end."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.api import EagerGraph, EngineArgs, LLMEngine, NumpyBackend, SamplingParams
from atlas_core.testing.fake_model import run_to_completion
from atlas_core.testing.frozen_graphs import FrozenGraphBackend
from atlas_core.testing.spec_drafts import ScriptedProposer

pytestmark = pytest.mark.timeout(180)

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "draft_token_cost": 0.0,
        "disable_by_batch_size": 4, "verify_graphs": True}


class _RunsAtCapture(NumpyBackend):
    """Numpy with graphs whose capture runs the step once, as cuda's does."""

    name = "numpy-capture-runs"

    @property
    def supports_graphs(self) -> bool:
        return True

    def capture(self, fn):
        fn()
        return EagerGraph(fn)


def make_engine(path, spec=None, graphs=False):
    """``graphs``: False (numpy, no graphs), True (graphs that run the step at capture) or a
    backend instance."""
    args = dict(model=str(path), num_kv_blocks=64, max_num_seqs=4, block_size=8,
                speculative_config=spec, async_scheduling=False)
    if graphs:
        backend = _RunsAtCapture() if graphs is True else graphs
        return LLMEngine.from_args(EngineArgs(**args), backend=backend)
    return LLMEngine.from_args(EngineArgs(**args, backend="numpy"))


def run(engine, ps, params, plain=None, wrong_rate=0.35):
    if plain is not None:
        proposer = ScriptedProposer({rid: out.outputs[0].token_ids for rid, out in plain.items()},
                                    engine.model.vocab_size, wrong_rate, seed=3)
        inner = proposer.propose
        caps = {"r0": 3, "r1": 1, "r2": 2}  # mixed draft counts: padded rows in one batch
        proposer.propose = lambda seq, k: inner(seq, min(k, caps.get(seq.request_id, k)))
        engine.speculator.proposer = proposer
    for i, p in enumerate(ps):
        engine.add_request(f"r{i}", p, params)
    return run_to_completion(engine)


@pytest.mark.parametrize("arch", ["Qwen3_5ForCausalLM", "Qwen3NextForCausalLM"])
@pytest.mark.parametrize("wrong_rate", [0.0, 0.35])
def test_hybrid_verify_graphs_keep_greedy_tokens(arch, wrong_rate, checkpoints):
    rng = np.random.default_rng(11)
    ps = [rng.integers(0, 370, n).tolist() for n in (13, 4, 21)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    plain = run(make_engine(checkpoints[arch]), ps, params)
    eager = run(make_engine(checkpoints[arch], SPEC), ps, params, plain, wrong_rate)
    engine = make_engine(checkpoints[arch], SPEC, graphs=True)
    graph = run(engine, ps, params, plain, wrong_rate)
    want = {rid: o.outputs[0].token_ids for rid, o in plain.items()}
    assert {rid: o.outputs[0].token_ids for rid, o in eager.items()} == want
    assert {rid: o.outputs[0].token_ids for rid, o in graph.items()} == want
    assert engine.runner.num_verify_replays > 0
    assert engine.state_cache.num_free_slots == engine.state_cache.num_slots
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.parametrize("arch", ["Qwen3_5ForCausalLM", "Qwen3NextForCausalLM"])
def test_hybrid_verify_graphs_replay_as_cuda_does(arch, checkpoints):
    """Graphs replayed as a CUDA graph replays (issue #27): the op calls recorded at capture
    on their recorded buffers, no captured function kept alive. The Gated DeltaNet verify
    layout's index arrays (token rows, cu_seqlens, order) were referenced only by the captured
    step's metadata: freed after capture, their memory reused on cuda (NaN logits from the
    first verify step, right tokens on numpy, whose graphs call the step again). Here a
    replay reading a released array raises, and greedy tokens must equal plain decoding."""
    rng = np.random.default_rng(11)
    ps = [rng.integers(0, 370, n).tolist() for n in (13, 4, 21)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    plain = run(make_engine(checkpoints[arch]), ps, params)
    engine = make_engine(checkpoints[arch], SPEC, graphs=FrozenGraphBackend())
    graph = run(engine, ps, params, plain, 0.35)
    want = {rid: o.outputs[0].token_ids for rid, o in plain.items()}
    assert {rid: o.outputs[0].token_ids for rid, o in graph.items()} == want
    assert engine.runner.num_verify_replays > 0
    assert engine.state_cache.num_free_slots == engine.state_cache.num_slots
