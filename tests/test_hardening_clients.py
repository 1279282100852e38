"""Real client traffic (issue #30): Claude Code-shaped Messages bodies, max_tokens clamping,
reserved chat_template_kwargs and stop-list caps, against the scripted engine."""

from __future__ import annotations

import json

import httpx
import pytest

from atlas_core.server import ServerConfig, create_app
from atlas_core.server.agent import MAX_STOP_BYTES, MAX_STOPS
from atlas_core.server.errors import APIError
from atlas_core.server.launch import ServerThread
from atlas_core.server.thinking import from_anthropic
from test_server_support import FakeAsyncEngine

MAX_SEQ_LEN = 512
USER = [{"role": "user", "content": "Hi"}]


def claude_code_body(**overrides) -> dict:
    """A /v1/messages body in the shape Claude Code 2.1 sends."""
    body = {
        "model": "tiny", "max_tokens": 32000, "stream": False, "temperature": 0,
        "system": [{"type": "text", "text": "You are Claude Code.",
                    "cache_control": {"type": "ephemeral"}},
                   {"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "list files",
                                          "cache_control": {"type": "ephemeral"}}]},
            {"role": "system", "content": "Reminder: the repo is clean."},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
            {"role": "system", "content": [{"type": "text", "text": "Second reminder."}]},
            {"role": "user", "content": "go on"}],
        "thinking": {"type": "adaptive", "display": "omitted"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015",
                                          "keep": "all"}]},
        "metadata": {"user_id": "user_abc_account_def_session_123"},
    }
    body.update(overrides)
    return body


def serve(engine: FakeAsyncEngine, **config):
    return ServerThread(create_app(engine, ServerConfig(served_model_names=["tiny"], **config)))


@pytest.fixture(scope="module")
def engine():
    return FakeAsyncEngine(max_seq_len=MAX_SEQ_LEN, delay=0)


@pytest.fixture(scope="module")
def server(engine):
    with serve(engine) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def last_prompt(engine) -> tuple[str, object]:
    _, ids, params = engine.requests[-1]
    return engine.tokenizer.decode(ids), params


def test_claude_code_body_is_served(http, engine):
    r = http.post("/v1/messages?beta=true", json=claude_code_body(),
                  headers={"anthropic-beta": "context-management-2025-06-27"})
    assert r.status_code == 200, r.text
    prompt, params = last_prompt(engine)
    assert prompt.startswith("<system>You are Claude Code.\nBe brief.\n\nReminder: the repo is "
                             "clean.\n\nSecond reminder.\n<user>list files\n<assistant>ok\n"
                             "<user>go on\n")
    assert "<think-on>" in prompt
    room = MAX_SEQ_LEN - len(engine.requests[-1][1])
    assert params.max_tokens == room
    body = r.json()
    assert body["stop_reason"] == "max_tokens" and body["usage"]["output_tokens"] == room


def test_claude_code_body_counts_tokens(http, engine):
    body = claude_code_body()
    r = http.post("/v1/messages/count_tokens?beta=true", json=body)
    assert r.status_code == 200, r.text
    http.post("/v1/messages", json={**body, "max_tokens": 1})
    assert r.json()["input_tokens"] == len(engine.requests[-1][1])


def test_claude_code_body_streams(http):
    events = []
    with http.stream("POST", "/v1/messages?beta=true",
                     json=claude_code_body(stream=True, max_tokens=64000)) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] == "max_tokens"
    assert events[-1]["type"] == "message_stop"


def test_unknown_message_role_is_still_a_400(http):
    r = http.post("/v1/messages", json=claude_code_body(
        messages=[{"role": "critic", "content": "x"}]))
    assert r.status_code == 400 and "unknown role `critic`" in r.text


def test_effort_maps_to_the_think_budget():
    assert from_anthropic({"type": "adaptive"}, {"effort": "high"}).budget == 16384
    assert from_anthropic({"type": "adaptive"}, {"effort": "low"}).budget == 1024
    assert from_anthropic({"type": "adaptive"}, {"effort": "max"}).budget is None
    explicit = from_anthropic({"type": "enabled", "budget_tokens": 77}, {"effort": "high"})
    assert explicit.enabled and explicit.budget == 77
    assert from_anthropic(None, {"effort": "medium"}).budget == 4096
    assert from_anthropic(None, {"effort": "medium"}).enabled is None
    assert from_anthropic({"type": "disabled"}, {"effort": "high"}).enabled is False
    with pytest.raises(APIError, match="output_config.effort must be one of"):
        from_anthropic({"type": "adaptive"}, {"effort": "extreme"})


@pytest.mark.parametrize("path, body, finish", [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 32000, "temperature": 0},
     lambda r: r["choices"][0]["finish_reason"]),
    ("/v1/chat/completions", {"messages": USER, "max_completion_tokens": 64000,
                              "temperature": 0}, lambda r: r["choices"][0]["finish_reason"]),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 32000, "temperature": 0},
     lambda r: r["choices"][0]["finish_reason"]),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 32000, "temperature": 0},
     lambda r: r["status"] + ":" + r["incomplete_details"]["reason"]),
])
def test_max_tokens_over_the_context_is_clamped(http, engine, path, body, finish):
    r = http.post(path, json={"model": "tiny", **body})
    assert r.status_code == 200, r.text
    prompt_len = len(engine.requests[-1][1])
    assert engine.requests[-1][2].max_tokens == MAX_SEQ_LEN - prompt_len
    assert finish(r.json()) in ("length", "incomplete:max_output_tokens")


def test_prompt_that_fills_the_context_is_still_a_400(http):
    r = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x" * MAX_SEQ_LEN}], "max_tokens": 10})
    assert r.status_code == 400 and "shorten the prompt" in r.text


def test_strict_max_tokens_keeps_the_400():
    engine = FakeAsyncEngine(max_seq_len=MAX_SEQ_LEN, delay=0)
    with serve(engine, strict_max_tokens=True) as srv:
        r = httpx.post(f"{srv.url}/v1/messages", json=claude_code_body(), timeout=30)
        assert r.status_code == 400
        assert "over this model's context of 512" in r.text and "lower max_tokens" in r.text
        fits = httpx.post(f"{srv.url}/v1/messages", json=claude_code_body(max_tokens=8),
                          timeout=30)
        assert fits.status_code == 200


@pytest.mark.parametrize("key", ["tools", "messages", "add_generation_prompt", "documents"])
def test_reserved_chat_template_kwargs_are_a_400(http, key):
    value = {"tools": [], "messages": USER, "add_generation_prompt": False,
             "documents": [{"title": "t", "text": "x"}]}[key]
    for path, body in (("/v1/chat/completions", {"messages": USER, "max_tokens": 2}),
                       ("/v1/messages", {"messages": USER, "max_tokens": 2}),
                       ("/v1/responses", {"input": "Hi", "max_output_tokens": 2})):
        r = http.post(path, json={**body, "chat_template_kwargs": {key: value}})
        assert r.status_code == 400, (path, r.text)
        assert f"chat_template_kwargs cannot set `{key}`" in r.text


def test_other_chat_template_kwargs_still_pass(http, engine):
    r = http.post("/v1/chat/completions", json={
        "messages": USER, "max_tokens": 2, "chat_template_kwargs": {"enable_thinking": True}})
    assert r.status_code == 200 and "<think-on>" in last_prompt(engine)[0]


@pytest.mark.parametrize("path, field, base", [
    ("/v1/chat/completions", "stop", {"messages": USER, "max_tokens": 2}),
    ("/v1/completions", "stop", {"prompt": "Hi", "max_tokens": 2}),
    ("/v1/messages", "stop_sequences", {"messages": USER, "max_tokens": 2}),
])
def test_stop_lists_are_capped(http, path, field, base):
    many = [f"stop{i}" for i in range(MAX_STOPS + 1)]
    r = http.post(path, json={**base, field: many})
    assert r.status_code == 400 and f"at most {MAX_STOPS}" in r.text, r.text
    big = ["x" * (MAX_STOP_BYTES // 2 + 1)] * 2
    r = http.post(path, json={**base, field: big})
    assert r.status_code == 400 and f"at most {MAX_STOP_BYTES} bytes" in r.text, r.text
    ok = http.post(path, json={**base, field: many[:MAX_STOPS]})
    assert ok.status_code == 200, ok.text


def test_huge_stop_list_is_refused_before_the_engine(http, engine):
    seen = len(engine.requests)
    r = http.post("/v1/chat/completions", json={
        "messages": USER, "max_tokens": 2, "stop": [f"s{i}" for i in range(300_000)]})
    assert r.status_code == 400 and len(engine.requests) == seen


def test_display_omitted_keeps_thinking_blocks_empty():
    engine = FakeAsyncEngine(reply="<think>secret plan</think>The answer.", delay=0)
    with serve(engine, reasoning_parser="think") as srv:
        body = {"model": "tiny", "max_tokens": 38, "temperature": 0, "messages": USER}
        shown = httpx.post(f"{srv.url}/v1/messages", json={
            **body, "thinking": {"type": "adaptive"}}, timeout=30).json()
        hidden = httpx.post(f"{srv.url}/v1/messages", json={
            **body, "thinking": {"type": "adaptive", "display": "omitted"}}, timeout=30).json()
        with httpx.stream("POST", f"{srv.url}/v1/messages", timeout=30, json={
                **body, "stream": True,
                "thinking": {"type": "adaptive", "display": "omitted"}}) as r:
            deltas = [json.loads(line[6:])["delta"]["type"] for line in r.iter_lines()
                      if line.startswith("data: ") and "content_block_delta" in line]
    assert shown["content"][0] == {"type": "thinking", "thinking": "secret plan",
                                   "signature": shown["content"][0]["signature"]}
    assert hidden["content"][0]["type"] == "thinking" and hidden["content"][0]["thinking"] == ""
    assert hidden["content"][0]["signature"] == shown["content"][0]["signature"]
    assert hidden["content"][1] == shown["content"][1]
    assert shown["content"][1]["text"].startswith("The answer.")
    assert "thinking_delta" not in deltas and "signature_delta" in deltas
