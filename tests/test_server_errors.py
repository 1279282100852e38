"""Bad input gets a clear 4xx in the API's own error shape, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from atlas_core.server import ServerConfig, create_app
from atlas_core.server.launch import ServerThread
from test_server_support import FakeAsyncEngine, wait_until

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
MSG = {"model": "fake", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def server():
    config = ServerConfig(served_model_names=["fake", "alias"], max_request_body=4096)
    with ServerThread(create_app(FakeAsyncEngine(max_seq_len=64), config)) as srv:
        with httpx.Client(base_url=srv.url, timeout=10) as client:
            yield client


def openai_error(response, status, param=None):
    assert response.status_code == status, response.text
    err = response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and "Traceback" not in err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err


def anthropic_error(response, status, kind):
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    return body["error"]


def still_serves(client):
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


def post_raw(client, path, content, **headers):
    return client.post(path, content=content, headers={"content-type": "application/json",
                                                       **headers})


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    (b"", None),
    (b"[1, 2]", None),
    (b'{"messages": "hi"}', "messages"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}', "max_tokens"),
    (b'{"messages": [{"content": "x"}]}', "messages[0].role"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": 9}', "temperature"),
    (b'{"messages": [{"role": "wizard", "content": "x"}]}', "messages[0].role"),
    (b'{"messages": []}', "messages"),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 0}', "n"),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
     "messages[0].content[0].type"),
])
def test_chat_invalid_body(server, body, param):
    openai_error(post_raw(server, "/v1/chat/completions", body), 400, param)
    still_serves(server)


@pytest.mark.parametrize("part, media", [
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "image"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "audio"),
])
def test_chat_media_parts_get_a_dedicated_message(server, part, media):
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is it"},
                                                      part]}]}
    err = openai_error(server.post("/v1/chat/completions", json=body), 400,
                       "messages[0].content[1].type")
    assert err["message"].startswith(f"{media} inputs are not supported")
    assert err["code"] == "unsupported_modality" and "vision" in err["message"]
    still_serves(server)


def test_bad_utf8(server):
    body = b'{"model": "fake", "messages": [{"role": "user", "content": "\xff\xfe"}]}'
    err = openai_error(post_raw(server, "/v1/chat/completions", body), 400)
    assert "UTF-8" in err["message"]
    still_serves(server)


def test_body_too_large(server):
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 10_000}]}
    err = openai_error(server.post("/v1/chat/completions", json=big), 413)
    assert "--max-request-body" in err["message"]
    anthropic_error(server.post("/v1/messages", json={**MSG, "system": "x" * 10_000}), 413,
                    "request_too_large")
    still_serves(server)


def test_unknown_model(server):
    err = openai_error(server.post("/v1/chat/completions", json={**CHAT, "model": "gpt-9"}), 404,
                       "model")
    assert "fake" in err["message"] and err["code"] == "model_not_found"
    assert server.post("/v1/chat/completions", json={**CHAT, "model": "alias"}).status_code == 200
    anthropic_error(server.post("/v1/messages", json={**MSG, "model": "claude-x"}), 404,
                    "not_found_error")
    openai_error(server.get("/v1/models/nope"), 404)


def test_over_context(server):
    clamped = server.post("/v1/chat/completions", json={**CHAT, "max_tokens": 60})
    assert clamped.status_code == 200, clamped.text
    usage = clamped.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= 64
    err = openai_error(server.post("/v1/completions", json={"prompt": "x" * 80}), 400)
    assert "64" in err["message"]
    assert server.post("/v1/messages", json={**MSG, "max_tokens": 100}).status_code == 200
    still_serves(server)


def test_over_context_strict():
    config = ServerConfig(served_model_names=["fake"], strict_max_tokens=True)
    with ServerThread(create_app(FakeAsyncEngine(max_seq_len=64), config)) as srv:
        with httpx.Client(base_url=srv.url, timeout=10) as client:
            err = openai_error(client.post("/v1/chat/completions",
                                           json={**CHAT, "max_tokens": 60}), 400, "max_tokens")
            assert "64" in err["message"] and "60" in err["message"]
            err = anthropic_error(client.post("/v1/messages", json={**MSG, "max_tokens": 100}),
                                  400, "invalid_request_error")
            assert "64" in err["message"]


def test_invalid_token_ids(server):
    err = openai_error(server.post("/v1/completions", json={"prompt": [5, 6, 99999]}), 400,
                       "prompt[0]")
    assert "99999" in err["message"]
    openai_error(server.post("/v1/completions", json={"prompt": [[5], [-1]]}), 400, "prompt[1]")
    openai_error(server.post("/detokenize", json={"tokens": [1, 100000]}), 400, "tokens")
    still_serves(server)


def test_unsupported_fields(server):
    openai_error(server.post("/v1/completions", json={"prompt": "a", "suffix": "b"}), 400,
                 "suffix")
    openai_error(server.post("/v1/completions", json={"prompt": "a", "logit_bias": {"x": 1}}),
                 400, "logit_bias")
    openai_error(server.post("/v1/chat/completions", json={**CHAT, "top_logprobs": 2}), 400,
                 "top_logprobs")


def test_anthropic_shapes(server):
    anthropic_error(post_raw(server, "/v1/messages", b"{oops"), 400, "invalid_request_error")
    err = anthropic_error(server.post("/v1/messages", json={"messages": MSG["messages"]}), 400,
                          "invalid_request_error")
    assert "max_tokens" in err["message"]
    bad_block = {**MSG, "messages": [{"role": "user", "content": [{"type": "image"}]}]}
    err = anthropic_error(server.post("/v1/messages", json=bad_block), 400,
                          "invalid_request_error")
    assert "image inputs are not supported" in err["message"]
    image_result = {**MSG, "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "see"}, {"type": "image", "source": {}}]}]}]}
    err = anthropic_error(server.post("/v1/messages", json=image_result), 400,
                          "invalid_request_error")
    assert "image inputs are not supported" in err["message"], "never dropped silently"
    anthropic_error(server.post("/v1/messages/count_tokens", json={}), 400,
                    "invalid_request_error")


def test_unknown_route_and_method(server):
    openai_error(server.get("/v1/nothing"), 404)
    openai_error(server.get("/v1/chat/completions"), 405)
    still_serves(server)


def test_queue_full():
    engine = FakeAsyncEngine(delay=0.01, max_running=2)
    app = create_app(engine, ServerConfig(served_model_names=["fake"]))
    with ServerThread(app) as srv:
        with httpx.Client(base_url=srv.url, timeout=10) as client:
            with client.stream("POST", "/v1/chat/completions",
                               json={**CHAT, "max_tokens": 200, "stream": True}) as first:
                assert first.status_code == 200
                with client.stream("POST", "/v1/chat/completions",
                                   json={**CHAT, "max_tokens": 200, "stream": True}) as second:
                    assert second.status_code == 200
                    third = client.post("/v1/chat/completions", json=CHAT)
                    err = openai_error(third, 429)
                    assert third.headers["retry-after"] == "1" and "busy" in err["message"]
                    anthropic_error(client.post("/v1/messages", json=MSG), 429, "rate_limit_error")
            assert wait_until(lambda: not engine.running)
            still_serves(client)


def test_auth():
    config = ServerConfig(served_model_names=["fake"], api_keys=["k1", "k2"])
    with ServerThread(create_app(FakeAsyncEngine(), config)) as srv:
        with httpx.Client(base_url=srv.url, timeout=10) as client:
            err = openai_error(client.post("/v1/chat/completions", json=CHAT), 401)
            assert "missing" in err["message"]
            openai_error(client.post("/v1/chat/completions", json=CHAT,
                                     headers={"Authorization": "Bearer nope"}), 401)
            anthropic_error(client.post("/v1/messages", json=MSG), 401, "authentication_error")
            ok = client.post("/v1/chat/completions", json=CHAT,
                             headers={"Authorization": "Bearer k2"})
            assert ok.status_code == 200
            assert client.post("/v1/messages", json=MSG, headers={"x-api-key": "k1"}).is_success
            assert client.get("/health").status_code == 200
            assert client.get("/metrics").status_code == 200
            assert client.get("/v1/models").status_code == 401


def test_loading_then_ready():
    import threading
    release = threading.Event()
    engine = FakeAsyncEngine()

    def loader():
        release.wait(10)
        return engine
    app = create_app(None, ServerConfig(served_model_names=["fake"]), loader=loader)
    with ServerThread(app) as srv:
        with httpx.Client(base_url=srv.url, timeout=10) as client:
            assert client.get("/health").status_code == 503
            err = openai_error(client.post("/v1/chat/completions", json=CHAT), 503)
            assert "loading" in err["message"]
            release.set()
            assert wait_until(lambda: client.get("/health").status_code == 200)
            still_serves(client)


def test_load_failure_reported():
    def loader():
        raise ValueError("no such model: /nope")
    app = create_app(None, ServerConfig(served_model_names=["fake"]), loader=loader)
    with ServerThread(app) as srv:
        with httpx.Client(base_url=srv.url, timeout=10) as client:
            assert wait_until(lambda: client.get("/health").json()["status"] == "error")
            assert "no such model" in client.get("/health").json()["message"]
            assert "no such model" in openai_error(
                client.post("/v1/chat/completions", json=CHAT), 503)["message"]

