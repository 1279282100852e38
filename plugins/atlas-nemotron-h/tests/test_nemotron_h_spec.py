"""Speculative decoding on Nemotron-H (issue #27 on a Mamba-2 hybrid): each verify position's
conv and SSM state goes to its own row, so rejected drafts roll back. Greedy tokens with n-gram
or scripted drafts (a third of them wrong) equal plain decoding, on the eager verify path
(numpy) and with verify steps replayed from graphs (mock backend), and every KV block and state
row comes back."""

import numpy as np
import pytest

from atlas_core.api import EngineArgs, LLMEngine, SamplingParams
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.fake_model import run_to_completion
from atlas_core.testing.spec_drafts import ScriptedProposer

pytestmark = pytest.mark.timeout(300)

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "draft_token_cost": 0.0}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_checkpoint("NemotronHForCausalLM", tmp_path_factory.mktemp("nemospec"))


def make_engine(model_dir, spec=None, backend="numpy"):
    return LLMEngine.from_args(EngineArgs(
        model=str(model_dir), backend=backend, speculative_config=spec, num_kv_blocks=64,
        max_num_seqs=4, block_size=8, async_scheduling=False))


def prompts():
    rng = np.random.default_rng(3)
    motif = rng.integers(0, 370, 4).tolist()
    return [motif * 5, rng.integers(0, 370, 9).tolist(), rng.integers(0, 370, 13).tolist()]


def run(engine, params, plain=None, wrong_rate=0.35):
    if plain is not None:
        engine.speculator.proposer = ScriptedProposer(
            {rid: out.outputs[0].token_ids for rid, out in plain.items()},
            engine.model.vocab_size, wrong_rate, seed=11)
    for i, p in enumerate(prompts()):
        engine.add_request(f"r{i}", p, params)
    return {rid: out.outputs[0].token_ids for rid, out in run_to_completion(engine).items()}


def plain_outputs(model_dir, params):
    engine = make_engine(model_dir)
    for i, p in enumerate(prompts()):
        engine.add_request(f"r{i}", p, params)
    return run_to_completion(engine)


def _freed(engine):
    bm = engine.block_manager
    return bm.num_free_blocks == bm.num_blocks


def test_ngram_speculation_keeps_plain_greedy_tokens(model_dir):
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    want = run(make_engine(model_dir), params)
    engine = make_engine(model_dir, NGRAM)
    assert run(engine, params) == want
    spec = engine.stats().speculative
    assert spec.num_draft_tokens > 0 and _freed(engine)


@pytest.mark.parametrize("wrong_rate", [0.35, 1.0])
def test_scripted_drafts_with_rejections_keep_plain_tokens(model_dir, wrong_rate):
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    plain = plain_outputs(model_dir, params)
    want = {rid: out.outputs[0].token_ids for rid, out in plain.items()}
    engine = make_engine(model_dir, NGRAM)
    assert run(engine, params, plain, wrong_rate) == want
    spec = engine.stats().speculative
    assert spec.num_draft_tokens > spec.num_accepted_tokens >= 0 and _freed(engine)


def test_verify_steps_replayed_from_graphs_keep_plain_tokens(model_dir):
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    plain = plain_outputs(model_dir, params)
    want = {rid: out.outputs[0].token_ids for rid, out in plain.items()}
    spec = {**NGRAM, "verify_graphs": True, "disable_by_batch_size": 4}
    engine = make_engine(model_dir, spec, backend="mock")
    assert run(engine, params, plain, 0.35) == want
    assert engine.runner.num_verify_replays > 0 and _freed(engine)
