"""Bad input at the HTTP layer gets a clear 4xx, never a 500, a reset or a stall; a web page
cannot drive a local server; one access-log line per request (issue #30)."""

from __future__ import annotations

import argparse
import logging
import socket
import time

import httpx
import pytest

from atlas_core.cli import serve
from atlas_core.server import ServerConfig, create_app
from atlas_core.server.launch import ServerThread
from test_server_support import FakeAsyncEngine

CHAT = {"model": "fake", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def config(**kwargs) -> ServerConfig:
    return ServerConfig(served_model_names=["fake"], **kwargs)


@pytest.fixture
def server(request):
    settings = getattr(request, "param", {})
    with ServerThread(create_app(FakeAsyncEngine(), config(**settings))) as srv:
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def raw_exchange(server, data: bytes, wait: float = 5.0) -> bytes:
    """Send ``data`` on a fresh connection; what the server answers before closing it."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def error_of(response: httpx.Response) -> dict:
    assert response.headers["content-type"].startswith("application/json")
    return response.json()["error"]


@pytest.mark.parametrize("field", ["chat_template_kwargs", "tools"])
def test_json_nested_too_deep_is_a_400(client, field):
    nested = '{"a":' * 5000 + "1" + "}" * 5000
    value = nested if field == "chat_template_kwargs" else f"[{nested}]"
    body = f'{{"model":"fake","messages":[{{"role":"user","content":"hi"}}],"{field}":{value}}}'
    r = client.post("/v1/chat/completions", content=body,
                    headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert error_of(r)["code"] == "json_too_deep"
    assert "nested too deeply" in error_of(r)["message"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
def test_a_body_that_is_not_json_is_a_415(client, content_type):
    r = client.post("/v1/chat/completions", content=b'{"messages": []}',
                    headers={"content-type": content_type})
    assert r.status_code == 415, r.text
    assert "Content-Type: application/json" in error_of(r)["message"]


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "application/vnd.api+json"])
def test_json_content_types_are_served(client, content_type):
    import json
    r = client.post("/v1/chat/completions", content=json.dumps(CHAT),
                    headers={"content-type": content_type})
    assert r.status_code == 200, r.text


def test_headers_over_the_limit_are_a_431(server, client):
    r = client.get("/health", headers={"x-big": "a" * 70_000})
    assert r.status_code == 431
    assert "larger than the server limit" in error_of(r)["message"]
    head = b"GET /health HTTP/1.1\r\nhost: localhost\r\n" + b"x-filler: abcdefgh\r\n" * 8000
    answer = raw_exchange(server, head)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"larger than the server limit" in answer


def test_garbage_gets_a_json_400_and_a_close(server):
    answer = raw_exchange(server, b"NOT HTTP AT ALL\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert b'"error"' in answer and b"malformed HTTP request" in answer


@pytest.mark.parametrize("server", [{"header_timeout": 0.5}], indirect=True)
def test_a_half_open_client_is_dropped_after_the_header_timeout(server, client):
    start = time.monotonic()
    answer = raw_exchange(server, b"GET /health HTTP/1.1\r\nhost: localhost\r\n")
    assert time.monotonic() - start < 3
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"did not arrive within 0.5 s" in answer
    idle = time.monotonic()
    assert raw_exchange(server, b"") == b""
    assert time.monotonic() - idle < 3
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize("server", [{"body_timeout": 0.5}], indirect=True)
def test_a_slow_body_gets_a_408(server, client):
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n"
            b"content-type: application/json\r\ncontent-length: 500\r\n\r\n{\"model\":")
    start = time.monotonic()
    answer = raw_exchange(server, head)
    assert time.monotonic() - start < 3
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"request body did not arrive" in answer
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


class ExplodingEngine(FakeAsyncEngine):
    async def generate(self, request_id, prompt_token_ids, params):
        raise RuntimeError("cannot open /home/alice/secret-model/weights.bin: token=hunter2")
        yield  # an async generator


@pytest.mark.parametrize("stream", [False, True])
def test_error_texts_leak_no_exception_text_or_path(stream):
    app = create_app(ExplodingEngine(), config())
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as client:
        r = client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    assert "/home/alice" not in r.text and "hunter2" not in r.text
    assert "internal server error" in r.text


def test_a_foreign_host_is_refused_without_an_api_key(client):
    r = client.post("/v1/chat/completions", json=CHAT, headers={"host": "attacker.example"})
    assert r.status_code == 403
    assert error_of(r)["code"] == "host_not_allowed"
    assert "--allowed-host attacker.example" in error_of(r)["message"]
    for host in ("localhost:8888", "127.0.0.1", "[::1]:8888"):
        assert client.get("/v1/models", headers={"host": host}).status_code == 200, host


def test_a_cross_site_origin_is_refused_without_an_api_key(server, client):
    r = client.post("/v1/chat/completions", json=CHAT, headers={"origin": "https://evil.example"})
    assert r.status_code == 403
    assert error_of(r)["code"] == "origin_not_allowed"
    preflight = client.options("/v1/chat/completions",
                               headers={"origin": "https://evil.example",
                                        "access-control-request-method": "POST"})
    assert preflight.status_code == 403
    same_site = client.post("/v1/chat/completions", json=CHAT, headers={"origin": server.url})
    assert same_site.status_code == 200


@pytest.mark.parametrize("server", [{"allowed_origins": ["https://ui.example"],
                                     "allowed_hosts": ["llm.lan"]}], indirect=True)
def test_allowed_origins_and_hosts_pass(client):
    r = client.post("/v1/chat/completions", json=CHAT,
                    headers={"origin": "https://ui.example", "host": "llm.lan:8888"})
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == "https://ui.example"


@pytest.mark.parametrize("server", [{"api_keys": ["k1"]}], indirect=True)
def test_with_an_api_key_the_key_is_the_guard(client):
    headers = {"origin": "https://evil.example", "host": "anything.example"}
    assert client.post("/v1/chat/completions", json=CHAT, headers=headers).status_code == 401
    r = client.post("/v1/chat/completions", json=CHAT,
                    headers={**headers, "authorization": "Bearer k1"})
    assert r.status_code == 200, r.text


def serve_config(*argv):
    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    return serve.server_config(parser.parse_args(["serve", *argv]))


def test_serve_flags():
    c = serve_config()
    assert set(c.allowed_hosts) == {"localhost", "127.0.0.1", "::1"} and c.access_log
    c = serve_config("--host", "192.168.1.5", "--allowed-host", "box.lan", "--no-access-log",
                     "--allowed-origins", "http://localhost:3000")
    assert {"192.168.1.5", "box.lan", "localhost"} <= set(c.allowed_hosts)
    assert not c.access_log and c.allowed_origins == ["http://localhost:3000"]
    assert serve_config("--host", "0.0.0.0").allowed_hosts == ["*"]
    assert "*" not in serve_config("--host", "0.0.0.0", "--allowed-host", "box").allowed_hosts


def access_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "atlas.access"]


@pytest.mark.parametrize("stream", [False, True])
def test_one_access_log_line_per_request(client, caplog, stream):
    caplog.set_level(logging.INFO, logger="atlas.access")
    client.post("/v1/chat/completions", json={**CHAT, "stream": stream}).raise_for_status()
    client.get("/v1/models").raise_for_status()
    client.post("/v1/chat/completions", content=b"x", headers={"content-type": "text/plain"})
    time.sleep(0.1)
    chat, models, refused = access_lines(caplog)
    assert " POST /v1/chat/completions 200 prompt_tokens=" in chat
    assert "completion_tokens=2 " in chat and "ttft_ms=" in chat and "duration_ms=" in chat
    assert " GET /v1/models 200 duration_ms=" in models
    assert " POST /v1/chat/completions 415 " in refused


@pytest.mark.parametrize("server", [{"access_log": False}], indirect=True)
def test_the_access_log_can_be_turned_off(client, caplog):
    caplog.set_level(logging.INFO, logger="atlas.access")
    client.post("/v1/chat/completions", json=CHAT).raise_for_status()
    assert access_lines(caplog) == []


def test_openapi_document_covers_every_route(client):
    from atlas_core.server.app import HANDLERS
    doc = client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    for handler in HANDLERS:
        for path in handler.paths:
            if path == "/openapi.json":
                continue
            path = path.replace(":str}", "}").replace(":path}", "}")
            methods = {m.lower() for m in handler.http_methods} - {"head"}
            assert methods <= set(doc["paths"][path]), (path, methods)
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    body = chat["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/ChatCompletionRequest"}
    request = doc["components"]["schemas"]["ChatCompletionRequest"]
    assert request["properties"]["model"]["anyOf"][0] == {"enum": ["fake"]}
    assert {"200", "400", "415", "431"} <= set(chat["responses"])


def test_a_load_failure_shows_clients_no_paths():
    def load():
        raise FileNotFoundError("[Errno 2] No such file: '/srv/models/private-llm/config.json'")

    app = create_app(None, config(), loader=load)
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as client:
        from test_server_support import wait_until
        assert wait_until(lambda: client.get("/health").json().get("status") == "error")
        health = client.get("/health").text
        chat = client.post("/v1/chat/completions", json=CHAT).text
    for text in (health, chat):
        assert "/srv/models" not in text and "<path>" in text, text


def test_without_paths_keeps_urls_and_hub_ids():
    from atlas_core.server.errors import without_paths
    assert without_paths("no /a/b/c.json here") == "no <path> here"
    assert without_paths("fetch https://hf.co/x failed") == "fetch https://hf.co/x failed"
    assert without_paths("Qwen/Qwen3-0.6B not found") == "Qwen/Qwen3-0.6B not found"
