"""Speculative decoding on the built-in demo model (real weights, numpy): the same replies as
without it, drafts accepted where replies echo the context, and the server's side of it
(per-request opt-out, /metrics counters)."""

from __future__ import annotations

import httpx
import pytest

from test_demo_model import TOOLS

pytestmark = pytest.mark.timeout(180)

CONVERSATIONS = [
    ([{"role": "user", "content": "What is 482 + 39?"}], None),
    ([{"role": "user", "content": "What's the weather in Paris?"},
      {"role": "assistant", "content": "",
       "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                        "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": '{"city": "Paris", "temperature": 18, "unit": "celsius", '
                                  '"condition": "sunny"}'}], TOOLS),
    ([{"role": "user", "content": "What is the capital of Japan?"}], None),
]


@pytest.fixture(scope="module")
def llms():
    pytest.importorskip("atlas_qwen3", reason="the atlas-qwen3 plugin is not installed")
    from atlas_core import LLM
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2}
    return LLM(None, backend="numpy"), LLM(None, backend="numpy", speculative_config=spec)


def prompts(llm):
    tok = llm.tokenizer
    return [{"prompt_token_ids": tok.encode(tok.apply_chat_template(m, tools=t,
                                                                     add_generation_prompt=True))}
            for m, t in CONVERSATIONS]


def test_demo_replies_are_identical_and_drafts_land(llms):
    from atlas_core import SamplingParams
    plain, spec = llms
    params = SamplingParams(temperature=0.0, max_tokens=32)
    want = plain.generate(prompts(plain), params)
    got = spec.generate(prompts(spec), params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert "sunny" in got[1].outputs[0].text
    st = spec.engine.stats().speculative
    assert st.num_accepted_tokens > 0 and st.num_draft_tokens >= st.num_accepted_tokens


def test_server_opt_out_and_metrics(llms):
    from atlas_core.engine import AsyncLLMEngine
    from atlas_core.server import ServerConfig, create_app
    from atlas_core.server.launch import ServerThread

    _, spec = llms
    engine = AsyncLLMEngine(spec.engine)
    app = create_app(engine, ServerConfig(served_model_names=["demo"]), tokenizer=spec.tokenizer)
    try:
        with ServerThread(app) as srv:
            messages = CONVERSATIONS[1][0]
            body = {"model": "demo", "messages": messages, "tools": TOOLS, "max_tokens": 24,
                    "temperature": 0}
            on = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60).json()
            off = httpx.post(f"{srv.url}/v1/chat/completions",
                             json={**body, "speculative": False}, timeout=60).json()
            assert on["choices"][0]["message"] == off["choices"][0]["message"]
            bad = httpx.post(f"{srv.url}/v1/chat/completions",
                             json={**body, "speculative": "sometimes"}, timeout=60)
            assert bad.status_code == 400 and "speculative" in bad.text
            metrics = httpx.get(f"{srv.url}/metrics", timeout=30).text
            for name in ("atlas_spec_decode_draft_tokens_total",
                         "atlas_spec_decode_accepted_tokens_total",
                         "atlas_spec_decode_acceptance_rate",
                         "atlas_spec_decode_mean_accepted_length"):
                assert name in metrics
    finally:
        engine.shutdown()
