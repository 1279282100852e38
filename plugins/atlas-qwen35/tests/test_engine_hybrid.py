"""The real engine over tiny hybrid checkpoints (numpy backend): parity with ForwardRunner,
chunked prefill, mixed batches, preemption, abort, n > 1 and decode discipline on the mock."""

from __future__ import annotations

import numpy as np
import pytest
from qwen35_cases import ARCHS

from atlas_core.api import SamplingParams, load_model
# test_engine_hybrid_prefix.py imports GREEDY, make_engine, run and assert_same from here too.
from atlas_core.testing.fake_model import (GREEDY, assert_engine_drained,
                                           assert_graph_decode_steps, make_engine,
                                           run_to_completion)
from atlas_core.testing.fake_model import (assert_same_completion as assert_same,
                                           run_requests as run)
from atlas_core.testing.forward import ForwardRunner

pytestmark = pytest.mark.timeout(120)


def prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 370, n).tolist()


def assert_all_free(engine):
    assert_engine_drained(engine)
    states = engine.state_cache
    assert not states.ref_counts and not states.pending_saves and not states.pending_restores


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_forward_runner(arch, checkpoints, registry, backend):
    prompts = [prompt(1, 11), prompt(2, 5), prompt(3, 19)]
    ref_model = load_model(checkpoints[arch], backend, registry=registry)
    runner = ForwardRunner(ref_model, backend, max_seqs=1)
    engine = make_engine(checkpoints[arch], max_prefill_tokens=12)
    outs = run(engine, prompts)
    for p, out in zip(prompts, outs):
        expected = runner.greedy([p], GREEDY.max_tokens)[0]
        assert out.outputs[0].token_ids == expected
        assert out.outputs[0].finish_reason == "length"
    assert_all_free(engine)


def test_chunked_prefill_equals_one_shot(checkpoints):
    path = checkpoints["Qwen3_5MoeForCausalLM"]
    long = prompt(4, 45)
    one_shot = run(make_engine(path, enable_prefix_caching=False), [long])[0]
    for caching in (False, True):
        chunked = make_engine(path, max_prefill_tokens=8, enable_prefix_caching=caching)
        assert_same(one_shot, run(chunked, [long])[0])
        assert chunked.stats().num_steps == 6 + GREEDY.max_tokens - 1


def test_mixed_batch_equals_each_sequence_alone(checkpoints):
    path = checkpoints["Qwen3NextForCausalLM"]
    prompts = [prompt(5, 21), prompt(6, 3), prompt(7, 30)]
    alone = [run(make_engine(path), [p])[0] for p in prompts]
    engine = make_engine(path, max_prefill_tokens=16)
    engine.add_request("r0", prompts[0], GREEDY)
    engine.step()
    engine.step()                       # r0 decodes while r1 and r2 prefill beside it
    for i in (1, 2):
        engine.add_request(f"r{i}", prompts[i], GREEDY)
    outs = run_to_completion(engine)
    for i, ref in enumerate(alone):
        assert_same(ref, outs[f"r{i}"])
    assert_all_free(engine)


@pytest.mark.parametrize("caching", [False, True])
def test_preemption_recomputes_and_frees_everything(checkpoints, caching):
    path = checkpoints["Qwen3_5ForCausalLM"]
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    prompts = [prompt(10 + i, 18 + 3 * i) for i in range(4)]
    alone = [run(make_engine(path), [p], params)[0] for p in prompts]
    engine = make_engine(path, num_kv_blocks=12, enable_prefix_caching=caching)
    outs = run(engine, prompts, params)
    assert engine.stats().num_preemptions > 0
    assert (engine.state_cache.num_restores > 0) == caching    # resumed from a snapshot
    for ref, out in zip(alone, outs):
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
    assert_all_free(engine)


def test_abort_frees_slots_and_blocks(checkpoints):
    engine = make_engine(checkpoints["Qwen3_5ForCausalLM"], max_prefill_tokens=8)
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    for i in range(6):
        engine.add_request(f"r{i}", prompt(20 + i, 13), params)
    for _ in range(4):
        engine.step()
    assert engine.state_cache.num_free_slots < engine.state_cache.num_slots
    for i in range(6):
        out = engine.abort_request(f"r{i}")
        assert out.finished and out.outputs[0].finish_reason == "abort"
    assert_all_free(engine)
    again = run(engine, [prompt(30, 9)])[0]
    assert again.outputs[0].token_ids == run(make_engine(checkpoints["Qwen3_5ForCausalLM"]),
                                             [prompt(30, 9)])[0].outputs[0].token_ids


def test_n_greater_than_one(checkpoints):
    path = checkpoints["Qwen3_5MoeForCausalLM"]
    p = prompt(40, 26)
    greedy = run(make_engine(path), [p])[0].outputs[0].token_ids
    engine = make_engine(path)
    out = run(engine, [p], SamplingParams(n=3, temperature=0, max_tokens=5, ignore_eos=True))[0]
    assert [c.token_ids for c in out.outputs] == [greedy] * 3
    assert out.num_cached_tokens == 24           # siblings restored the snapshot at token 24
    sampled = SamplingParams(n=3, temperature=0.9, seed=5, max_tokens=6, ignore_eos=True)
    warm = run(make_engine(path), [p], sampled)[0]
    cold = run(make_engine(path, enable_prefix_caching=False), [p], sampled)[0]
    assert [c.token_ids for c in warm.outputs] == [c.token_ids for c in cold.outputs]
    assert_all_free(engine)


def test_mock_decode_steps_allocate_nothing_and_sync_once(checkpoints):
    engine = make_engine(checkpoints["Qwen3_5MoeForCausalLM"], backend="mock", async_scheduling=False)
    for i in range(3):
        engine.add_request(f"r{i}", prompt(50 + i, 6 + i), SamplingParams(
            temperature=0.7, seed=i, max_tokens=6, ignore_eos=True))
    engine.step()
    records = assert_graph_decode_steps(engine, steps=5, num_seqs=3)
    assert [rec.count("capture") for rec in records] == [1, 0, 0, 0, 0]    # captured once
    assert not engine.has_unfinished_requests()
