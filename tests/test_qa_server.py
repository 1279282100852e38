"""QA regressions found by driving the server the way real clients do."""

from __future__ import annotations

import httpx
import pytest

from atlas_core.server import ServerConfig, create_app
from atlas_core.server.launch import ServerThread
from test_server_support import FakeAsyncEngine, wait_until

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server():
    config = ServerConfig(served_model_names=["/models/qwen3", "qwen3", "Qwen/Qwen3-0.6B"])
    engine = FakeAsyncEngine(delay=0.002)
    with ServerThread(create_app(engine, config)) as srv:
        with httpx.Client(base_url=srv.url, timeout=10) as client:
            yield client


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 3, "n": None, "stream": None,
                              "logprobs": None, "temperature": None, "stop": None}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 3, "n": None, "echo": None,
                         "stream": None}),
    ("/v1/messages", {"model": "qwen3", "max_tokens": 3, "messages": USER, "stream": None,
                      "system": None, "tools": None}),
])
def test_null_means_default(server, path, body):
    """LangChain / LiteLLM / JS clients send explicit nulls for unset optional fields."""
    r = server.post(path, json=body)
    assert r.status_code == 200, r.text


def test_null_in_required_field_still_names_it(server):
    r = server.post("/v1/chat/completions", json={"messages": None})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_nested_nulls_are_kept(server):
    r = server.post("/v1/chat/completions", json={
        "messages": USER, "max_tokens": 2, "chat_template_kwargs": {"enable_thinking": None}})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("name", ["/models/qwen3", "qwen3", "Qwen/Qwen3-0.6B"])
def test_model_card_for_every_served_name(server, name):
    """Served names include local paths (leading slash) and hub ids (inner slash)."""
    r = server.get(f"/v1/models/{name}")
    assert r.status_code == 200, r.text
    assert r.json()["id"] == name


def _metric(client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def test_disconnected_stream_counts_its_tokens(server):
    before = _metric(server, "atlas_generation_tokens_total")
    body = {"messages": USER, "max_tokens": 400, "stream": True, "ignore_eos": True}
    with server.stream("POST", "/v1/chat/completions", json=body) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 10:
                break
    assert wait_until(lambda: _metric(server, "atlas_num_requests_running") == 0)
    after = _metric(server, "atlas_generation_tokens_total")
    assert 0 < after - before < 400


def test_anthropic_assistant_prefill_is_continued():
    """Anthropic semantics: a final assistant turn is continued, not closed and re-opened."""
    engine = FakeAsyncEngine()
    config = ServerConfig(served_model_names=["qwen3"])
    prefill = {"role": "assistant", "content": [{"type": "text", "text": '{"a":'}]}
    body = {"model": "qwen3", "max_tokens": 3, "messages": [*USER, prefill]}
    with ServerThread(create_app(engine, config)) as srv:
        r = httpx.post(srv.url + "/v1/messages", json=body, timeout=10)
        assert r.status_code == 200, r.text
        prompt = engine.tokenizer.decode(engine.requests[-1][1])
        assert prompt.endswith('<assistant>{"a":'), prompt
        r = httpx.post(srv.url + "/v1/messages", json={**body, "messages": USER}, timeout=10)
        assert engine.tokenizer.decode(engine.requests[-1][1]).endswith("<user>hi\n<assistant>")


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
    ("/v1/messages", {"model": "qwen3", "max_tokens": 2, "messages": USER}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
])
def test_streams_are_event_streams(server, path, body):
    """Open WebUI (and other proxies) only stream a response typed text/event-stream."""
    with server.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream"), r.headers
        r.read()
    r = server.post(path, json=body)
    assert r.headers["content-type"].startswith("application/json")


def test_metrics_content_type_parses(server):
    """Prometheus 3 rejects a scrape whose Content-Type repeats a parameter."""
    from email.message import Message

    r = server.get("/metrics")
    header = r.headers["content-type"]
    assert header.count("charset") == 1, header
    msg = Message()
    msg["content-type"] = header
    assert msg.get_content_type() == "text/plain" and msg.get_param("version") == "0.0.4"


def test_forced_tool_choice_without_tools_speaks_the_clients_api(server):
    """An Anthropic client sent `any`; the message must not talk about OpenAI's `required`."""
    r = server.post("/v1/messages", json={"model": "qwen3", "max_tokens": 2, "messages": USER,
                                          "tool_choice": {"type": "any"}})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "required" not in message and "needs `tools`" in message


def test_shutdown_ends_open_streams_cleanly():
    """Ctrl-C used to wait out uvicorn's 5 s grace, then cut streams and print a traceback."""
    import threading
    import time

    engine = FakeAsyncEngine(delay=0.01)
    lines: list[str] = []
    started = threading.Event()

    def client(url):
        body = {"messages": USER, "max_tokens": 100_000 // 256, "stream": True,
                "ignore_eos": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=20) as r:
            for line in r.iter_lines():
                lines.append(line)
                started.set()

    srv = ServerThread(create_app(engine, ServerConfig(served_model_names=["qwen3"])))
    with srv:
        thread = threading.Thread(target=client, args=(srv.url,))
        thread.start()
        assert started.wait(10)
        begin = time.monotonic()
    thread.join(10)
    assert time.monotonic() - begin < 3
    assert [line for line in lines if line][-1] == "data: [DONE]", lines[-3:]
    assert any('"finish_reason":"abort"' in line for line in lines)
