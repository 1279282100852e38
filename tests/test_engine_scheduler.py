"""Scheduler through the engine, on a fake model whose logits depend on the KV-cached context."""

import pytest

from atlas_core.engine import SamplingParams
from atlas_core.testing.fake_model import make_fake_engine, run_to_completion

GREEDY = SamplingParams(temperature=0, max_tokens=12)


def record_steps(engine):
    steps = []
    execute = engine.runner.execute

    def wrapped(sched, rows_of):
        steps.append([(s.seq.request_id, s.start, s.num_tokens) for s in sched.scheduled])
        return execute(sched, rows_of)
    engine.runner.execute = wrapped
    return steps


def assert_all_blocks_free(engine):
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert all(r == 0 for r in bm.ref_counts)


def prompt(seed, n):
    return [(seed * 7 + i * 3) % 60 + 1 for i in range(n)]


def test_outputs_match_reference_and_blocks_are_freed():
    engine = make_fake_engine()
    prompts = {f"r{i}": prompt(i, 5 + 9 * i) for i in range(4)}
    for rid, p in prompts.items():
        engine.add_request(rid, p, GREEDY)
    outs = run_to_completion(engine)
    for rid, p in prompts.items():
        assert outs[rid].outputs[0].token_ids == engine.model.greedy(p, 12)
        assert outs[rid].outputs[0].finish_reason == "length"
    assert_all_blocks_free(engine)


def test_mixed_prefill_and_decode_in_one_step():
    engine = make_fake_engine()
    steps = record_steps(engine)
    engine.add_request("a", prompt(1, 10), GREEDY)
    engine.step()
    engine.add_request("b", prompt(2, 30), GREEDY)
    engine.step()
    assert sorted(steps[1]) == [("a", 10, 1), ("b", 0, 30)]
    outs = run_to_completion(engine)
    assert outs["b"].outputs[0].token_ids == engine.model.greedy(prompt(2, 30), 12)


def test_chunked_prefill_respects_budget_and_matches():
    engine = make_fake_engine(max_prefill_tokens=16)
    steps = record_steps(engine)
    long = prompt(3, 100)
    engine.add_request("long", long, GREEDY)
    engine.add_request("short", prompt(4, 7), GREEDY)
    outs = run_to_completion(engine)
    for step in steps:
        assert sum(n for _, start, n in step if n > 1 or start == 0) <= 16
    assert [n for rid, _, n in (s[0] for s in steps[:7])] == [16] * 6 + [4]
    assert outs["long"].outputs[0].token_ids == engine.model.greedy(long, 12)
    assert outs["short"].outputs[0].token_ids == engine.model.greedy(prompt(4, 7), 12)


def test_preemption_resumes_with_identical_tokens():
    engine = make_fake_engine(num_kv_blocks=8, max_prefill_tokens=64)
    params = SamplingParams(temperature=0, max_tokens=40)
    sampled = SamplingParams(temperature=1.0, seed=11, max_tokens=40)
    prompts = {f"g{i}": prompt(i, 20) for i in range(3)}
    for rid, p in prompts.items():
        engine.add_request(rid, p, params)
    engine.add_request("s", prompt(9, 20), sampled)
    outs = run_to_completion(engine)
    assert engine.stats().num_preemptions > 0
    for rid, p in prompts.items():
        assert outs[rid].outputs[0].token_ids == engine.model.greedy(p, 40)
    alone = make_fake_engine(num_kv_blocks=64)
    alone.add_request("s", prompt(9, 20), sampled)
    assert run_to_completion(alone)["s"].outputs[0].token_ids == outs["s"].outputs[0].token_ids
    assert_all_blocks_free(engine)


def test_max_num_seqs_bounds_running():
    engine = make_fake_engine(max_num_seqs=2)
    for i in range(5):
        engine.add_request(f"r{i}", prompt(i, 6), SamplingParams(temperature=0, max_tokens=4))
    seen = 0
    while engine.has_unfinished_requests():
        engine.step()
        seen = max(seen, len(engine.scheduler.running))
        assert len(engine.scheduler.running) <= 2
    assert seen == 2


def test_max_batch_size_rotates_so_everyone_progresses():
    engine = make_fake_engine(max_num_seqs=4, max_batch_size=2)
    steps = record_steps(engine)
    for i in range(4):
        engine.add_request(f"r{i}", prompt(i, 6), SamplingParams(temperature=0, max_tokens=6))
    outs = run_to_completion(engine)
    assert all(len(s) <= 2 for s in steps)
    for i in range(4):
        assert outs[f"r{i}"].outputs[0].token_ids == engine.model.greedy(prompt(i, 6), 6)


def test_request_that_can_never_fit_is_rejected():
    engine = make_fake_engine(num_kv_blocks=4)
    assert engine.max_seq_len == 64
    with pytest.raises(ValueError, match=r"maximum context length is 64 tokens.*60 in the prompt, 10"):
        engine.add_request("big", prompt(1, 60), SamplingParams(max_tokens=10))
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.add_request("empty", [], SamplingParams())
    with pytest.raises(ValueError, match=r"prompt token ids must be in \[0, 64\)"):
        engine.add_request("oov", [1, 99], SamplingParams())


def test_abort_frees_blocks_at_once():
    engine = make_fake_engine()
    engine.add_request("a", prompt(1, 40), SamplingParams(max_tokens=30))
    engine.step()
    engine.step()
    assert engine.block_manager.num_used_blocks > 0
    final = engine.abort_request("a")
    assert final.finished and final.outputs[0].finish_reason == "abort"
    assert engine.block_manager.num_used_blocks == 0 or all(
        r == 0 for r in engine.block_manager.ref_counts)
    assert not engine.has_unfinished_requests()
    assert engine.abort_request("a") is None
    assert_all_blocks_free(engine)


def test_warm_prefix_cache_skips_prefill_and_matches():
    engine = make_fake_engine()
    p = prompt(5, 50)
    engine.add_request("cold", p, GREEDY)
    cold = run_to_completion(engine)["cold"]
    before = engine.model.num_forward_tokens
    engine.add_request("warm", p, GREEDY)
    warm = run_to_completion(engine)["warm"]
    assert cold.num_cached_tokens == 0 and warm.num_cached_tokens == 48
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
    assert engine.model.num_forward_tokens - before == 2 + 11
    stats = engine.stats()
    assert stats.prefix_cache_hits == 48 and stats.prefix_cache_queries == 100


def test_duplicate_request_id_rejected():
    engine = make_fake_engine()
    engine.add_request("x", [1, 2], GREEDY)
    with pytest.raises(ValueError, match="already running"):
        engine.add_request("x", [1, 2], GREEDY)
