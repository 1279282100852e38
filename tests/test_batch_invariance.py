"""Batch invariance on the numpy backend: a request gets the same tokens and the same logprob
bits alone as in any batch (mixed prefill and decode rows, chunked prefill, prefix caching on and
off, greedy and seeded sampling), on tiny bf16 Qwen3 and hybrid Qwen3.5-MoE checkpoints."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
from atlas_core.testing.fake_model import run_to_completion
from atlas_core.plugins import Registry
from atlas_core.testing.checkpoints import write_tiny_checkpoint

pytestmark = pytest.mark.timeout(120)

ARCHS = ("Qwen3ForCausalLM", "Qwen3_5MoeForCausalLM")
MAX_TOKENS = 32


@pytest.fixture(scope="module", params=ARCHS)
def model_dir(request, tmp_path_factory):
    registry = Registry()
    if request.param not in registry.names("weight_loaders"):
        pytest.skip(f"{request.param} is not registered (install its plugin)")
    return write_tiny_checkpoint(request.param, tmp_path_factory.mktemp(request.param),
                                 dtype="bfloat16", registry=registry)


def make_engine(model_dir, caching: bool, num_kv_blocks: int = 128) -> LLMEngine:
    return LLMEngine.from_args(EngineArgs(
        model=str(model_dir), backend="numpy", num_kv_blocks=num_kv_blocks, max_num_seqs=8,
        block_size=8, max_prefill_tokens=24, enable_prefix_caching=caching))


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(0)
    shared = rng.integers(0, 370, 33).tolist()
    lengths = (5, 30, 13, 47, 2, 21)
    out = [rng.integers(0, 370, n).tolist() for n in lengths]
    return out + [shared + out[2], shared + out[4]]


def params(i: int, seeded: bool) -> SamplingParams:
    if seeded:
        return SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=100 + i,
                              max_tokens=MAX_TOKENS, logprobs=2, ignore_eos=True)
    return SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=2, ignore_eos=True)


def completion(out) -> tuple:
    c = out.outputs[0]
    return c.token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in c.logprobs]


@functools.cache
def run_alone(model_dir, seeded) -> list[tuple]:
    """Each prompt alone in a fresh engine (no prefix caching: the batched runs with and
    without it must both reproduce these bits)."""
    results = []
    for i, p in enumerate(prompts()):
        engine = make_engine(model_dir, caching=False)
        engine.add_request("a", p, params(i, seeded))
        results.append(completion(run_to_completion(engine)["a"]))
    return results


def run_batched(model_dir, caching, seeded, arrivals, num_kv_blocks=128):
    """All prompts in one engine; request ``i`` is added before step ``arrivals[i]``.
    Returns the completions and the engine's stats."""
    engine = make_engine(model_dir, caching, num_kv_blocks)
    pending = sorted(range(len(prompts())), key=lambda i: arrivals[i])
    outs, step = {}, 0
    while pending or engine.has_unfinished_requests():
        while pending and arrivals[pending[0]] <= step:
            i = pending.pop(0)
            engine.add_request(f"r{i}", prompts()[i], params(i, seeded))
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out
        step += 1
    results = [completion(outs[f"r{i}"]) for i in range(len(prompts()))]
    return results, engine.stats()


@pytest.mark.parametrize("caching", [False, True], ids=["no-cache", "prefix-cache"])
@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
def test_alone_equals_batched_bitwise(model_dir, caching, seeded):
    alone = run_alone(model_dir, seeded)
    together, _ = run_batched(model_dir, caching, seeded, [0] * len(alone))
    staggered, stats = run_batched(model_dir, caching, seeded, [0, 0, 1, 3, 3, 7, 9, 12])
    # the last prompt reuses the shared prefix of the one before
    assert (stats.prefix_cache_hits > 0) == caching
    for i, want in enumerate(alone):
        assert len(want[0]) == MAX_TOKENS
        assert together[i] == want, f"request {i}: all-at-once batch differs from alone"
        assert staggered[i] == want, f"request {i}: staggered batch differs from alone"


@pytest.mark.parametrize("caching", [False, True], ids=["no-cache", "prefix-cache"])
def test_preempted_requests_recompute_the_same_bits(model_dir, caching):
    alone = run_alone(model_dir, True)
    squeezed, stats = run_batched(model_dir, caching, True, [0] * len(alone), num_kv_blocks=24)
    assert stats.num_preemptions > 0
    assert squeezed == alone
