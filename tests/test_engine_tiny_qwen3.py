"""The engine on a real tiny Qwen3 checkpoint (numpy backend): chunking, prefix cache, batching."""

import numpy as np
import pytest

from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
from atlas_core.testing.fake_model import run_to_completion
from atlas_core.testing.checkpoints import write_tiny_checkpoint

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path_factory.mktemp("qwen3"))


def make_engine(model_dir, **kwargs):
    kwargs.setdefault("num_kv_blocks", 64)
    kwargs.setdefault("max_num_seqs", 8)
    return LLMEngine.from_args(EngineArgs(model=str(model_dir), backend="numpy", **kwargs))


def prompt(seed, n):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 370, n).tolist()


GREEDY = SamplingParams(temperature=0, max_tokens=6, logprobs=5, ignore_eos=True)


def run(engine, requests):
    for rid, (p, params) in requests.items():
        engine.add_request(rid, p, params)
    return run_to_completion(engine)


def assert_same(a, b):
    ca, cb = a.outputs[0], b.outputs[0]
    assert ca.token_ids == cb.token_ids
    for la, lb in zip(ca.logprobs, cb.logprobs):
        np.testing.assert_allclose([v for _, v in la.top], [v for _, v in lb.top], rtol=1e-4,
                                   atol=1e-5)


def test_chunked_prefill_equals_one_shot(model_dir):
    long = prompt(1, 150)
    one_shot = run(make_engine(model_dir), {"x": (long, GREEDY)})["x"]
    chunked = make_engine(model_dir, max_prefill_tokens=32)
    out = run(chunked, {"x": (long, GREEDY)})["x"]
    assert chunked.stats().num_steps == 5 + 5
    assert_same(one_shot, out)


def test_warm_prefix_cache_equals_cold_and_skips_prefill(model_dir):
    engine = make_engine(model_dir)
    p = prompt(2, 70)
    cold = run(engine, {"cold": (p, GREEDY)})["cold"]
    warm = run(engine, {"warm": (p, GREEDY)})["warm"]
    assert cold.num_cached_tokens == 0 and warm.num_cached_tokens == 64
    assert_same(cold, warm)
    shared = run(engine, {"fork": (p[:40] + prompt(3, 10), GREEDY)})["fork"]
    assert shared.num_cached_tokens == 32


def test_mixed_batch_equals_each_alone(model_dir):
    requests = {f"r{i}": (prompt(10 + i, 5 + 17 * i), GREEDY) for i in range(4)}
    alone = {}
    engine = make_engine(model_dir, enable_prefix_caching=False)
    for rid, req in requests.items():
        alone.update(run(engine, {rid: req}))
    batched = run(make_engine(model_dir, max_prefill_tokens=24), requests)
    for rid in requests:
        assert_same(alone[rid], batched[rid])


def test_preemption_keeps_greedy_tokens(model_dir):
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    requests = {f"r{i}": (prompt(20 + i, 20), params) for i in range(3)}
    roomy = run(make_engine(model_dir), requests)
    tight = make_engine(model_dir, num_kv_blocks=7)
    out = run(tight, requests)
    assert tight.stats().num_preemptions > 0
    for rid in requests:
        assert out[rid].outputs[0].token_ids == roomy[rid].outputs[0].token_ids
    assert tight.block_manager.num_free_blocks == 7


def test_eos_from_generation_config_and_text(model_dir):
    engine = make_engine(model_dir)
    assert engine.stop_checker.eos_token_ids == {377, 379}
    assert engine.default_sampling_params().temperature == 0.0
    out = run(engine, {"t": (engine.tokenizer.encode("Hello"), SamplingParams(max_tokens=5,
                                                                              seed=1))})["t"]
    completion = out.outputs[0]
    assert completion.text == engine.tokenizer.decode(completion.token_ids)
    assert out.metrics.first_token_time >= out.metrics.arrival_time
    assert out.metrics.finish_time >= out.metrics.first_token_time
