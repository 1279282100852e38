"""Sampling through the engine: seeds, n > 1, logprobs, penalties, logit bias, prompt logprobs."""

import numpy as np

from atlas_core.engine import SamplingParams
from atlas_core.testing.fake_model import make_fake_engine, run_to_completion
from atlas_core.ops import reference as ref


def prompt(seed, n):
    return [(seed * 5 + i * 7) % 60 + 1 for i in range(n)]


def generate(requests, **engine_kwargs):
    engine = make_fake_engine(**engine_kwargs)
    for rid, (p, params) in requests.items():
        engine.add_request(rid, p, params)
    return run_to_completion(engine), engine


def test_seed_gives_same_tokens_regardless_of_batch():
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16)
    alone, _ = generate({"x": (prompt(1, 9), params)})
    crowd = {f"o{i}": (prompt(i + 2, 5 + i), SamplingParams(temperature=0.7, max_tokens=20))
             for i in range(5)}
    crowd["x"] = (prompt(1, 9), params)
    mixed, _ = generate(crowd, max_prefill_tokens=8)
    assert alone["x"].outputs[0].token_ids == mixed["x"].outputs[0].token_ids
    other, _ = generate({"x": (prompt(1, 9), SamplingParams(temperature=1.0, top_p=0.9, seed=99,
                                                            max_tokens=16))})
    assert other["x"].outputs[0].token_ids != alone["x"].outputs[0].token_ids


def test_sampled_tokens_follow_the_reference_sampler():
    params = SamplingParams(temperature=0.8, top_k=5, seed=7, max_tokens=6)
    out, engine = generate({"x": (prompt(3, 4), params)})
    context, expected = prompt(3, 4), []
    for step in range(6):
        logits = engine.model.logits_for(context)[None]
        tok = int(ref.sample(logits, np.array([0.8], np.float32), np.array([5], np.int32),
                             np.ones(1, np.float32), np.zeros(1, np.float32),
                             np.array([7], np.uint64), np.array([step], np.int64))[0])
        expected.append(tok)
        context.append(tok)
    assert out["x"].outputs[0].token_ids == expected


def test_n_completions_share_the_prompt_blocks():
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=10)
    out, engine = generate({"x": (prompt(2, 40), params)})
    completions = out["x"].outputs
    assert [c.index for c in completions] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in completions}) == 3
    assert engine.stats().prefix_cache_hits == 2 * 32
    assert all(len(c.token_ids) == 10 for c in completions)
    again, _ = generate({"y": (prompt(2, 40), params)}, enable_prefix_caching=False)
    assert [c.token_ids for c in again["y"].outputs] == [c.token_ids for c in completions]


def test_logprobs_of_chosen_and_top_tokens():
    out, engine = generate({"x": (prompt(4, 6), SamplingParams(temperature=0, logprobs=3,
                                                             max_tokens=4))})
    completion = out["x"].outputs[0]
    assert len(completion.logprobs) == 4
    context = prompt(4, 6)
    for tok, lp in zip(completion.token_ids, completion.logprobs):
        expected = ref.log_softmax(engine.model.logits_for(context)[None])[0]
        assert lp.token_id == tok
        np.testing.assert_allclose(lp.logprob, expected[tok], rtol=1e-5)
        assert [t for t, _ in lp.top] == list(np.argsort(-expected, kind="stable")[:3])
        assert lp.top[0][0] == tok
        context.append(tok)


def test_logprobs_zero_gives_only_the_chosen():
    out, _ = generate({"x": (prompt(4, 6), SamplingParams(temperature=1, seed=3, logprobs=0,
                                                        max_tokens=3))})
    assert all(lp.top == [] for lp in out["x"].outputs[0].logprobs)


def test_prompt_logprobs():
    p = prompt(6, 20)
    out, engine = generate({"x": (p, SamplingParams(temperature=0, prompt_logprobs=2,
                                                     max_tokens=2))}, max_prefill_tokens=8)
    plp = out["x"].prompt_logprobs
    assert plp[0] is None and len(plp) == 20
    for i in range(1, 20):
        expected = ref.log_softmax(engine.model.logits_for(p[:i])[None])[0]
        assert plp[i].token_id == p[i]
        np.testing.assert_allclose(plp[i].logprob, expected[p[i]], rtol=1e-5)
        assert len(plp[i].top) == 2


def test_frequency_penalty_discourages_repeats():
    base = SamplingParams(temperature=0, max_tokens=30)
    plain, engine = generate({"x": (prompt(1, 3), base)})
    p = SamplingParams(temperature=0, max_tokens=30, frequency_penalty=2.0, presence_penalty=2.0,
                       repetition_penalty=1.5)
    pen, _ = generate({"x": (prompt(1, 3), p)})
    plain_ids, pen_ids = plain["x"].outputs[0].token_ids, pen["x"].outputs[0].token_ids
    assert len(set(pen_ids)) >= len(set(plain_ids))
    context = prompt(1, 3)
    for tok in pen_ids:
        logits = engine.model.logits_for(context)[None]
        ctx = np.array([context[:3]], np.int32)
        outs = np.array([context[3:] or [-1]], np.int32)
        expected = ref.apply_penalties(logits, ctx, outs, np.array([1.5], np.float32),
                                       np.array([2.0], np.float32), np.array([2.0], np.float32))
        assert tok == int(np.argmax(expected))
        context.append(tok)


def test_logit_bias_forces_a_token():
    out, _ = generate({"x": (prompt(1, 3), SamplingParams(temperature=0.5, seed=1, max_tokens=5,
                                                        logit_bias={17: 100.0}))})
    assert out["x"].outputs[0].token_ids == [17] * 5
