"""Prefix caching on hybrid models: recurrent-state snapshots at block boundaries, restored by
warm requests (identical outputs, prefill skipped); the LLM API and the HTTP server serve them."""

from __future__ import annotations

import openai
import pytest
from test_engine_hybrid import GREEDY, assert_all_free, assert_same, make_engine, prompt, run

from atlas_core.api import (LLM, AsyncLLMEngine, SamplingParams, ServerConfig, ServerThread,
                            create_app)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def path(checkpoints):
    return checkpoints["Qwen3_5MoeForCausalLM"]


def test_warm_prefix_restores_the_snapshot_and_matches_cold(path):
    engine = make_engine(path)
    p = prompt(1, 37)
    cold = run(engine, [p])[0]
    steps = engine.stats().num_steps
    warm = run(engine, [p])[0]
    assert cold.num_cached_tokens == 0 and warm.num_cached_tokens == 32
    assert_same(cold, warm, exact=True)
    assert engine.stats().num_steps - steps == GREEDY.max_tokens     # one 5-token prefill step
    assert engine.state_cache.num_restores == 1
    stats = engine.stats()
    assert stats.prefix_cache_hits == 32 and stats.prefix_cache_queries == 2 * 37
    fresh = run(make_engine(path, enable_prefix_caching=False), [p])[0]
    assert_same(cold, fresh)
    assert_all_free(engine)


def test_longer_prompt_reuses_a_chunk_boundary(path):
    engine = make_engine(path, max_prefill_tokens=16)
    first = prompt(2, 30)
    run(engine, [first])
    longer = first + prompt(3, 12)
    warm = run(engine, [longer])[0]
    assert warm.num_cached_tokens == 24          # chunks ended at 16 and 24 (the last boundary)
    cold = run(make_engine(path, enable_prefix_caching=False), [longer])[0]
    assert_same(cold, warm)


def test_a_hit_needs_both_kv_blocks_and_the_snapshot(path):
    engine = make_engine(path, num_state_snapshots=1)
    a, b = prompt(4, 20), prompt(5, 20)
    run(engine, [a])
    run(engine, [b])                             # b's snapshot evicts a's (one row)
    assert run(engine, [a])[0].num_cached_tokens == 0
    assert run(engine, [a])[0].num_cached_tokens == 16
    engine.block_manager.reset_prefix_cache()    # snapshot kept, KV blocks gone
    assert run(engine, [a])[0].num_cached_tokens == 0
    off = make_engine(path, num_state_snapshots=0)
    run(off, [a])
    assert run(off, [a])[0].num_cached_tokens == 0 and off.kv_config.num_state_snapshots == 0


def test_state_rows_are_sized_with_the_kv_cache(path):
    engine = make_engine(path, max_num_seqs=3)
    kv = engine.kv_config
    assert kv.num_state_slots == 3 and kv.num_state_snapshots == 3
    pools = engine.runner.state_pools
    assert len(pools) == 2 * 3 and all(pool.shape[0] == 6 for pool in pools)
    assert kv.state_bytes_per_slot == sum(p[0].nbytes for p in pools)


def test_llm_api_serves_a_hybrid_model(path):
    llm = LLM(str(path), backend="numpy", num_kv_blocks=64, max_num_seqs=4, block_size=8)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    text = "The quick brown fox jumps over the lazy dog and keeps running far away"
    first, second = llm.generate([text, text], params)
    assert first.outputs[0].token_ids == second.outputs[0].token_ids
    assert llm.generate(text, params)[0].num_cached_tokens > 0


def test_openai_sdk_against_a_hybrid_server(path):
    engine = AsyncLLMEngine(make_engine(path, max_seq_len=256))
    app = create_app(engine, ServerConfig(served_model_names=["hybrid"]))
    try:
        with ServerThread(app) as srv:
            client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=30)
            messages = [{"role": "user", "content": "Tell me a story about a lighthouse keeper."}]
            kw = dict(model="hybrid", messages=messages, max_tokens=6, temperature=0)
            first = client.chat.completions.create(**kw)
            again = client.chat.completions.create(**kw)
            assert again.choices[0].message.content == first.choices[0].message.content
            assert again.usage.prompt_tokens_details.cached_tokens > 0
            chunks = list(client.chat.completions.create(**kw, stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text == first.choices[0].message.content
    finally:
        engine.shutdown()
