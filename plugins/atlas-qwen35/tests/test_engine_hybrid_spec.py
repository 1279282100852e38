"""Speculative decoding on tiny hybrid checkpoints (numpy): Gated DeltaNet state rolls back to
the last accepted position through per-position state rows; tokens and logprobs stay those of
plain decoding at every acceptance count, with prefix snapshots on."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.api import EngineArgs, LLMEngine, SamplingParams
from atlas_core.testing.fake_model import run_to_completion
from atlas_core.testing.spec_drafts import ScriptedProposer

pytestmark = pytest.mark.timeout(120)

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "draft_token_cost": 0.0,
        "disable_by_batch_size": 4}


def make_engine(path, spec=None, **kwargs):
    kwargs = {"num_kv_blocks": 64, "max_num_seqs": 4, "block_size": 8, **kwargs}
    return LLMEngine.from_args(EngineArgs(model=str(path), backend="numpy",
                                          speculative_config=spec, **kwargs))


def run(engine, params, prompts, plain=None, wrong_rate=0.35):
    if plain is not None:
        engine.speculator.proposer = ScriptedProposer(
            {rid: out.outputs[0].token_ids for rid, out in plain.items()},
            engine.model.vocab_size, wrong_rate, seed=3)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    return run_to_completion(engine)


def test_kv_plan_keeps_state_rows_for_drafts(checkpoints):
    engine = make_engine(checkpoints["Qwen3_5ForCausalLM"], SPEC)
    kv = engine.kv_config
    assert kv.num_spec_state_rows == 4 * 3 + 1  # + the verify graphs' scratch row
    assert kv.num_state_rows == kv.num_state_slots + kv.num_state_snapshots + 13


@pytest.mark.parametrize("arch", ["Qwen3_5ForCausalLM", "Qwen3NextForCausalLM"])
def test_greedy_is_unchanged_and_state_rolls_back(arch, checkpoints):
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, 370, n).tolist() for n in (13, 4, 21)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    plain = run(make_engine(checkpoints[arch]), params, prompts)
    engine = make_engine(checkpoints[arch], SPEC)
    spec = run(engine, params, prompts, plain)
    for rid in plain:
        a, b = plain[rid].outputs[0], spec[rid].outputs[0]
        assert a.token_ids == b.token_ids
        for la, lb in zip(a.logprobs, b.logprobs):
            np.testing.assert_allclose(la.logprob, lb.logprob, rtol=1e-4, atol=1e-5)
    st = engine.stats().speculative
    assert 0 < st.num_accepted_tokens < st.num_draft_tokens
    assert engine.stats().num_steps < plain_steps(plain, params)
    assert engine.state_cache.num_free_slots == engine.state_cache.num_slots


def plain_steps(plain, params):
    return len(plain) * params.max_tokens


def test_follow_up_turn_restores_a_snapshot_and_matches(checkpoints):
    path = checkpoints["Qwen3_5MoeForCausalLM"]
    rng = np.random.default_rng(12)
    first = rng.integers(0, 370, 18).tolist()
    params = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)
    plain = run(make_engine(path), params, [first])
    engine = make_engine(path, SPEC)
    out = run(engine, params, [first], plain, wrong_rate=0.2)
    follow = first + out["r0"].outputs[0].token_ids + [5, 6, 7]
    engine.add_request("again", follow, params)
    again = run_to_completion(engine)["again"]
    assert again.num_cached_tokens >= 16
    ref = run(make_engine(path), params, [follow])["r0"]
    assert again.outputs[0].token_ids == ref.outputs[0].token_ids


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["Qwen3_5ForCausalLM", "Qwen3NextForCausalLM"])
def test_cuda_greedy_is_unchanged_with_drafts(arch, checkpoints, cuda_backend):
    rng = np.random.default_rng(13)
    prompts = [rng.integers(0, 370, n).tolist() for n in (13, 4, 21)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

    def engine(spec=None):
        args = EngineArgs(model=str(checkpoints[arch]), num_kv_blocks=64, max_num_seqs=4,
                          block_size=8, speculative_config=spec)
        return LLMEngine.from_args(args, backend=cuda_backend)

    plain = run(engine(), params, prompts)
    spec_engine = engine(SPEC)
    spec = run(spec_engine, params, prompts, plain)
    assert {r: o.outputs[0].token_ids for r, o in spec.items()} == {
        r: o.outputs[0].token_ids for r, o in plain.items()}
    assert spec_engine.stats().speculative.num_accepted_tokens > 0
