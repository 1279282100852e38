"""The real engine over the tiny Nemotron-H checkpoint (numpy backend): greedy = ForwardRunner,
chunked prefill = one shot, mixed batch = each sequence alone, warm prefix cache = cold,
preemption and abort free every slot and block. Same tokens, logprobs within 1e-4 (BLAS rounds
a projection differently for different row counts); a warm restore is bitwise."""

from __future__ import annotations

import pytest
from nemotron_checkpoints import prompt

from atlas_core.api import SamplingParams, load_model
from atlas_core.testing.fake_model import (GREEDY, assert_graph_decode_steps, make_engine,
                                           run_to_completion)
from atlas_core.testing.fake_model import (assert_engine_drained as assert_all_free,
                                           assert_same_completion as assert_same,
                                           run_requests as run)
from atlas_core.testing.forward import ForwardRunner

pytestmark = pytest.mark.timeout(180)


def test_greedy_equals_forward_runner(checkpoint, registry, backend):
    prompts = [prompt(1, 11), prompt(2, 5), prompt(3, 19)]
    runner = ForwardRunner(load_model(checkpoint, backend, registry=registry), backend, max_seqs=1)
    engine = make_engine(checkpoint, max_prefill_tokens=12)
    for p, out in zip(prompts, run(engine, prompts)):
        assert out.outputs[0].token_ids == runner.greedy([p], GREEDY.max_tokens)[0]
    assert_all_free(engine)


def test_chunked_prefill_equals_one_shot(checkpoint):
    long = prompt(4, 45)          # crosses the SSD chunk (16) and KV block (8) sizes
    one_shot = run(make_engine(checkpoint, enable_prefix_caching=False), [long])[0]
    for caching in (False, True):
        chunked = make_engine(checkpoint, max_prefill_tokens=8, enable_prefix_caching=caching)
        assert_same(one_shot, run(chunked, [long])[0])
        assert chunked.stats().num_steps == 6 + GREEDY.max_tokens - 1


def test_mixed_batch_equals_each_sequence_alone(checkpoint):
    prompts = [prompt(5, 21), prompt(6, 3), prompt(7, 30)]
    alone = [run(make_engine(checkpoint), [p])[0] for p in prompts]
    engine = make_engine(checkpoint, max_prefill_tokens=16)
    engine.add_request("r0", prompts[0], GREEDY)
    engine.step()
    engine.step()                       # r0 decodes while r1 and r2 prefill beside it
    for i in (1, 2):
        engine.add_request(f"r{i}", prompts[i], GREEDY)
    outs = run_to_completion(engine)
    for i, ref in enumerate(alone):
        assert_same(ref, outs[f"r{i}"])
    assert_all_free(engine)


def test_warm_prefix_cache_equals_cold(checkpoint):
    engine = make_engine(checkpoint)
    p = prompt(8, 37)
    cold = run(engine, [p])[0]
    warm = run(engine, [p])[0]
    assert cold.num_cached_tokens == 0 and warm.num_cached_tokens == 32
    assert engine.state_cache.num_restores == 1
    assert_same(cold, warm, exact=True)
    assert_same(cold, run(make_engine(checkpoint, enable_prefix_caching=False), [p])[0])
    assert_all_free(engine)


@pytest.mark.parametrize("caching", [False, True])
def test_preemption_recomputes_and_frees_everything(checkpoint, caching):
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    prompts = [prompt(10 + i, 18 + 3 * i) for i in range(4)]
    alone = [run(make_engine(checkpoint), [p], params)[0] for p in prompts]
    engine = make_engine(checkpoint, num_kv_blocks=12, enable_prefix_caching=caching)
    outs = run(engine, prompts, params)
    assert engine.stats().num_preemptions > 0
    for ref, out in zip(alone, outs):
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
    assert_all_free(engine)


def test_abort_frees_slots_and_blocks(checkpoint):
    engine = make_engine(checkpoint, max_prefill_tokens=8)
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    for i in range(6):
        engine.add_request(f"r{i}", prompt(20 + i, 13), params)
    for _ in range(4):
        engine.step()
    for i in range(6):
        assert engine.abort_request(f"r{i}").outputs[0].finish_reason == "abort"
    assert_all_free(engine)


def test_mock_decode_steps_allocate_nothing_and_sync_once(checkpoint):
    engine = make_engine(checkpoint, "mock", async_scheduling=False)
    for i in range(3):
        engine.add_request(f"r{i}", prompt(50 + i, 6 + i), SamplingParams(
            temperature=0.7, seed=i, max_tokens=6, ignore_eos=True))
    engine.step()
    records = assert_graph_decode_steps(engine, steps=4, num_seqs=3)
    assert [rec.count("capture") for rec in records] == [1, 0, 0, 0]    # captured once
