"""Speculative decoding on a tiny Qwen3 checkpoint (numpy): the same tokens, logprobs, stops
and prefix-cache hits as without it, at every acceptance count; config, drafts and gate."""

import numpy as np
import pytest

from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
from atlas_core.engine.spec import SpecGate, SpeculativeConfig, ngram_drafts
from atlas_core.guided import GuidedDecodingParams
from atlas_core.engine.spec.gate import best_k
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.fake_model import run_to_completion
from atlas_core.testing.spec_drafts import ScriptedProposer

pytestmark = pytest.mark.timeout(120)

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "draft_token_cost": 0.0}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path_factory.mktemp("qwen3spec"))


def make_engine(model_dir, spec=None, **kwargs):
    kwargs = {"num_kv_blocks": 64, "max_num_seqs": 4, "block_size": 8, **kwargs}
    return LLMEngine.from_args(EngineArgs(model=str(model_dir), backend="numpy",
                                          speculative_config=spec, **kwargs))


def prompts():
    rng = np.random.default_rng(0)
    motif = rng.integers(0, 370, 5).tolist()
    return [motif * 4, rng.integers(0, 370, 9).tolist(), rng.integers(0, 370, 3).tolist()]


def run(engine, params, ps, proposer_from=None, wrong_rate=0.3):
    if proposer_from is not None:
        engine.speculator.proposer = ScriptedProposer(
            {rid: out.outputs[0].token_ids for rid, out in proposer_from.items()},
            engine.model.vocab_size, wrong_rate)
    for i, p in enumerate(ps):
        engine.add_request(f"r{i}", p, params if isinstance(params, SamplingParams) else params[i])
    return run_to_completion(engine)


def assert_same(a, b):
    for rid in a:
        assert len(a[rid].outputs) == len(b[rid].outputs)
        for ca, cb in zip(a[rid].outputs, b[rid].outputs):
            assert_same_completion(ca, cb)


def assert_same_completion(ca, cb):
    assert ca.token_ids == cb.token_ids and ca.text == cb.text
    assert ca.finish_reason == cb.finish_reason
    for la, lb in zip(ca.logprobs or [], cb.logprobs or []):
        assert la.token_id == lb.token_id
        np.testing.assert_allclose(la.logprob, lb.logprob, rtol=1e-4, atol=1e-5)
        assert [t for t, _ in la.top] == [t for t, _ in lb.top]


@pytest.mark.parametrize("wrong_rate", [0.0, 0.35, 1.0])
def test_greedy_with_logprobs_is_unchanged_at_every_acceptance(model_dir, wrong_rate):
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, logprobs=2)
    plain = run(make_engine(model_dir), params, prompts())
    engine = make_engine(model_dir, SPEC)
    spec = run(engine, params, prompts(), proposer_from=plain, wrong_rate=wrong_rate)
    assert_same(plain, spec)
    st = engine.stats()
    assert st.speculative.num_draft_tokens > 0
    if wrong_rate == 0.0:
        assert st.speculative.num_accepted_tokens == st.speculative.num_draft_tokens
        assert st.num_steps < 14 + 1
    if wrong_rate == 1.0:
        assert st.speculative.num_accepted_tokens == 0
    assert engine.block_manager.num_used_blocks == 0


def test_seeded_sampling_gives_the_same_stream(model_dir):
    ps = prompts()
    params = [SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=s, max_tokens=12,
                             ignore_eos=True, n=2) for s in (1, 2, 3)]
    plain = run(make_engine(model_dir), params, ps)
    spec = run(make_engine(model_dir, SPEC), params, ps, proposer_from=plain, wrong_rate=0.3)
    assert_same(plain, spec)


def test_stop_strings_max_tokens_and_opt_out(model_dir):
    ps = prompts()
    plain = run(make_engine(model_dir), SamplingParams(temperature=0, max_tokens=10,
                                                       ignore_eos=True), ps)
    stop_id = plain["r0"].outputs[0].token_ids[4]
    params = [SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[stop_id]),
              SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, speculative=False)]
    want = run(make_engine(model_dir), params, ps)
    engine = make_engine(model_dir, SPEC)
    got = run(engine, params, ps, proposer_from=plain, wrong_rate=0.0)
    assert_same(want, got)
    assert got["r0"].outputs[0].finish_reason == "stop"
    assert len(got["r1"].outputs[0].token_ids) == 7
    assert engine.block_manager.num_used_blocks == 0


def test_prefix_cache_sees_the_same_blocks(model_dir):
    long = prompts()[0] * 2
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    plain = run(make_engine(model_dir), params, [long])
    engine = make_engine(model_dir, SPEC)
    first = run(engine, params, [long], proposer_from=plain, wrong_rate=0.2)
    follow = long + first["r0"].outputs[0].token_ids
    engine.add_request("again", follow, params)
    out = run_to_completion(engine)["again"]
    assert out.num_cached_tokens == (len(follow) - 1) // 8 * 8
    ref = run(make_engine(model_dir), params, [follow])["r0"]
    assert out.outputs[0].token_ids == ref.outputs[0].token_ids


def test_ngram_drafts_continue_the_latest_match():
    assert ngram_drafts([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3], 2, 1, 3) == [7, 5]
    assert ngram_drafts([4, 5, 6, 4, 5], 3, 2, 2) == [6, 4, 5]
    assert ngram_drafts([1, 2, 3], 2, 1, 3) == []
    assert ngram_drafts([8, 8], 4, 1, 2) == [8]


def test_config_forms_and_errors():
    assert SpeculativeConfig.parse(None) is None
    c = SpeculativeConfig.parse('{"method": "mtp", "num_speculative_tokens": 2, "model": "x"}')
    assert (c.method, c.num_speculative_tokens) == ("mtp", 2)
    assert SpeculativeConfig.parse({"num_drafts": 3}).num_speculative_tokens == 3
    for bad, word in (("{", "JSON"), ({"method": "eagle"}, "method"),
                      ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
                      ({"lookahead": 1}, "unknown")):
        with pytest.raises(ValueError, match=word):
            SpeculativeConfig.parse(bad)
    with pytest.raises(ValueError, match="speculative"):
        SamplingParams(speculative="yes")


def test_mtp_on_a_model_without_a_head_says_so(model_dir):
    with pytest.raises(ValueError, match="ngram"):
        make_engine(model_dir, {"method": "mtp"})


def test_gate_turns_down_with_acceptance_and_batch():
    assert best_k(0.9, 4, 0.0) == 4 and best_k(0.0, 4, 0.05) == 0
    assert best_k(0.8, 4, 0.05) > best_k(0.8, 4, 0.05 * 16)
    gate = SpecGate(3, 0.05, max_batch=8, max_context_len=1000)
    assert gate.num_drafts(100, 9) == 0 and gate.num_drafts(2000, 1) == 0
    for _ in range(200):
        gate.record(50_000, 3, 0)
    assert gate.rate(50_000) < 0.05 and gate.rate(100) == pytest.approx(0.6)
    long_gate = SpecGate(3, 0.05, max_batch=8)
    for _ in range(200):
        long_gate.record(50_000, 3, 0)
    decisions = [long_gate.num_drafts(50_000, 1) for _ in range(64)]
    assert decisions.count(1) == 2 and set(decisions) == {0, 1}
    assert long_gate.num_drafts(100, 1) == 3


def test_cli_flags_pick_the_method(tmp_path):
    import argparse
    import json

    from atlas_core.cli._speculative import add_speculative_arguments, speculative_config
    parser = argparse.ArgumentParser()
    add_speculative_arguments(parser)
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"mtp_num_hidden_layers": 1}}))
    assert speculative_config(parser.parse_args(["--speculative"]), str(tmp_path)) == {
        "method": "mtp", "num_speculative_tokens": 2}
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    (plain_dir / "config.json").write_text(json.dumps({"hidden_size": 64}))
    assert speculative_config(parser.parse_args(["--speculative", "--num-drafts", "3"]),
                              str(plain_dir)) == {"method": "ngram", "num_speculative_tokens": 3}
    # no model: the built-in demo model, which ships an MTP head
    assert speculative_config(parser.parse_args(["--speculative"]), None) == {
        "method": "mtp", "num_speculative_tokens": 2}
    given = parser.parse_args(["--speculative-config", '{"method": "ngram"}'])
    assert speculative_config(given, None) == {"method": "ngram"}
    with pytest.raises(ValueError, match="--num-drafts needs --speculative"):
        speculative_config(parser.parse_args(["--num-drafts", "2"]), None)
    with pytest.raises(SystemExit):
        parser.parse_args(["--speculative-config", "[1]"])


def test_opt_out_and_batch_limit_draft_nothing(model_dir):
    ps = prompts()
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    plain = run(make_engine(model_dir), params, ps)
    off = make_engine(model_dir, SPEC)
    run(off, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, speculative=False), ps,
        proposer_from=plain, wrong_rate=0.0)
    assert off.stats().speculative.num_drafts == 0
    crowded = make_engine(model_dir, {**SPEC, "disable_by_batch_size": 2})
    assert_same(plain, run(crowded, params, ps, proposer_from=plain, wrong_rate=0.0))
    assert crowded.stats().speculative.num_drafts == 0


@pytest.mark.parametrize("extra", [
    dict(temperature=0, presence_penalty=0.8, frequency_penalty=0.6, repetition_penalty=1.3),
    dict(temperature=0.8, seed=5, dry_multiplier=0.8, dry_allowed_length=1, xtc_probability=0.5,
         xtc_threshold=0.05, top_n_sigma=1.5)])
def test_penalties_and_filters_see_the_drafts_before_each_row(model_dir, extra):
    ps = [prompts()[0], prompts()[0][:7]]
    params = SamplingParams(max_tokens=14, ignore_eos=True, **extra)
    plain = run(make_engine(model_dir), params, ps)
    engine = make_engine(model_dir, SPEC)
    assert_same(plain, run(engine, params, ps, proposer_from=plain, wrong_rate=0.3))
    assert engine.stats().speculative.num_accepted_tokens > 0


def test_thinking_budget_forces_the_same_end(model_dir):
    ps = prompts()[:2]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, thinking_budget=6,
                            thinking_end_token_ids=[7, 8])
    plain = run(make_engine(model_dir), params, ps)
    assert all(o.outputs[0].token_ids[6:8] == [7, 8] for o in plain.values())
    engine = make_engine(model_dir, SPEC)
    assert_same(plain, run(engine, params, ps, proposer_from=plain, wrong_rate=0.2))
    assert engine.stats().speculative.num_accepted_tokens > 0


@pytest.mark.parametrize("guided", [
    GuidedDecodingParams.json_schema({"type": "object", "properties": {
        "name": {"type": "string"}, "n": {"type": "integer"}}, "required": ["name", "n"]}),
    GuidedDecodingParams.regex("(ab|ba)+ [0-9]{3,6}")])
def test_guided_rows_are_masked_after_their_drafts(model_dir, guided):
    ps = prompts()
    params = SamplingParams(temperature=0, max_tokens=24, guided=guided)
    plain = run(make_engine(model_dir), params, ps)
    engine = make_engine(model_dir, SPEC)
    assert_same(plain, run(engine, params, ps, proposer_from=plain, wrong_rate=0.3))
    assert engine.stats().speculative.num_accepted_tokens > 0


def test_preemption_under_kv_pressure(model_dir):
    ps = [prompts()[0] + prompts()[1], prompts()[0][::-1] * 2, prompts()[1] * 3]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    plain = run(make_engine(model_dir), params, ps)
    engine = make_engine(model_dir, SPEC, num_kv_blocks=14)
    assert_same(plain, run(engine, params, ps, proposer_from=plain, wrong_rate=0.2))
    assert engine.stats().num_preemptions > 0
    assert engine.stats().speculative.num_accepted_tokens > 0
    assert engine.block_manager.num_used_blocks == 0


def test_speculation_refuses_a_recurrent_layer_that_cannot_roll_back():
    """A recurrent layer without ``RecurrentStateSpec.spec_verify`` would keep rejected drafts in
    its state: speculation is refused with the layer named; one that verifies position by
    position passes."""
    from types import SimpleNamespace

    from atlas_core.engine.spec.setup import prepare_model
    from atlas_core.interfaces.layer import KVCacheSpec, RecurrentStateSpec

    class LegacyMamba:
        def state_spec(self):
            return RecurrentStateSpec({"ssm": (4, 4)})

    class Verifying(LegacyMamba):
        def state_spec(self):
            return RecurrentStateSpec({"ssm": (4, 4)}, spec_verify=True)

    class Attn:
        def state_spec(self):
            return KVCacheSpec(2, 8)

    config = SpeculativeConfig.parse(SPEC)
    with pytest.raises(ValueError, match="LegacyMamba layers of this model keep a recurrent"):
        prepare_model(SimpleNamespace(layers=[Attn(), LegacyMamba()]), config)
    prepare_model(SimpleNamespace(layers=[Attn(), Verifying()]), config)
    prepare_model(SimpleNamespace(layers=[LegacyMamba()]), None)


def test_speculative_flag_asks_the_family_loader_for_a_real_head(tmp_path):
    """``--speculative`` takes ``mtp`` only for a checkpoint whose loader attaches an MTP head:
    Qwen3.5 with ``mtp.*`` tensors; not for a config that declares MTP layers without them,
    nor for DeepSeek-V3's ``num_nextn_predict_layers`` (its loader skips that head)."""
    import argparse
    import json

    from atlas_core.cli._speculative import add_speculative_arguments, has_mtp_layers
    from atlas_core.plugins import Registry
    from atlas_core.testing.mtp_heads import add_mtp_head
    registry = Registry()
    if "Qwen3_5ForCausalLM" not in registry.names("weight_loaders"):
        pytest.skip("atlas-qwen35 is not installed")
    parser = argparse.ArgumentParser()
    add_speculative_arguments(parser)
    arch = "Qwen3_5ForCausalLM"
    with_head = write_tiny_checkpoint(arch, tmp_path / "head", registry=registry)
    add_mtp_head(with_head, arch, registry.create("weight_loaders", arch, registry=registry))
    assert has_mtp_layers(str(with_head))
    without = write_tiny_checkpoint(arch, tmp_path / "declared", registry=registry)
    config = json.loads((without / "config.json").read_text())
    (without / "config.json").write_text(json.dumps({**config, "mtp_num_hidden_layers": 1}))
    assert not has_mtp_layers(str(without))
    if "DeepseekV3ForCausalLM" in registry.names("weight_loaders"):
        deepseek = write_tiny_checkpoint("DeepseekV3ForCausalLM", tmp_path / "ds",
                                         registry=registry, num_nextn_predict_layers=1)
        assert not has_mtp_layers(str(deepseek))
    assert not has_mtp_layers(str(tmp_path / "nowhere"))
