"""A huge prompt cannot freeze the server: prompts that cannot fit the context are refused
before tokenizing, tokenization never holds the event loop, and shutdown does not wait for it
(issue #30)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from atlas_core.engine.loading import model_path_or_demo
from atlas_core.server import ServerConfig, create_app
from atlas_core.server.launch import ServerThread
from atlas_core.tokenizer import Tokenizer
from atlas_core.tokenizer.tokenizer import EncodeCancelled, PromptTooLong
from test_server_support import FakeAsyncEngine


@pytest.fixture(scope="module")
def demo_dir():
    try:
        return model_path_or_demo(None)
    except FileNotFoundError:
        pytest.skip("the built-in demo model is not installed")


def engine_with_real_tokenizer(demo_dir, max_seq_len: int) -> FakeAsyncEngine:
    engine = FakeAsyncEngine(max_seq_len=max_seq_len)
    engine.tokenizer = Tokenizer.from_dir(demo_dir)
    return engine


def health_latencies(client: httpx.Client, busy: threading.Thread) -> list[float]:
    """Latencies of ``GET /health`` polled until ``busy`` ends."""
    latencies = []
    while busy.is_alive():
        start = time.monotonic()
        assert client.get("/health").status_code == 200
        latencies.append(time.monotonic() - start)
        time.sleep(0.01)
    return latencies


def test_the_bound_is_the_longest_token_times_the_context(demo_dir):
    tok = Tokenizer.from_dir(demo_dir)
    assert tok.max_input_chars is None
    tok.limit_input(100)
    longest = max(len(t) for t in tok.backend.get_vocab())
    assert tok.max_chars_per_token == longest
    assert tok.max_input_chars == 100 * longest * 2
    with pytest.raises(PromptTooLong, match="characters fits this model's context of 100"):
        tok.encode("a" * (tok.max_input_chars + 1))
    text = "word " * 40
    assert tok.encode(text) == tok.backend.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}], "max_tokens": 2}),
    ("/v1/completions", {"prompt": None, "max_tokens": 2}),
    ("/v1/messages", {"messages": [{"role": "user", "content": None}], "max_tokens": 2}),
])
def test_a_30_mb_prompt_is_refused_at_once_and_health_stays_fast(demo_dir, path, body):
    huge = "lorem ipsum dolor sit amet " * (30_000_000 // 27)
    if "prompt" in body:
        body = {**body, "prompt": huge}
    else:
        body = {**body, "messages": [{"role": "user", "content": huge}]}
    app = create_app(engine_with_real_tokenizer(demo_dir, 512),
                     ServerConfig(served_model_names=["fake"], access_log=False))
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as client:
        result = {}
        content = json.dumps({"model": "fake", **body}).encode()
        slow = threading.Thread(target=lambda: result.update(r=client.post(
            path, content=content, headers={"content-type": "application/json"})))
        start = time.monotonic()
        slow.start()
        latencies = health_latencies(client, slow)
        slow.join()
        elapsed = time.monotonic() - start
    r = result["r"]
    assert r.status_code == 400, r.text
    assert "characters fits this model's context of 512 tokens" in r.text
    assert elapsed < 10, f"refusing took {elapsed:.1f} s"
    assert max(latencies) < 1.0, f"/health took up to {max(latencies):.3f} s"


def test_a_long_prompt_that_may_fit_is_tokenized_off_the_event_loop(demo_dir):
    app = create_app(engine_with_real_tokenizer(demo_dir, 10_000_000),
                     ServerConfig(served_model_names=["fake"], access_log=False))
    prompt = "the quick brown fox jumps over the lazy dog. " * 20_000
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=120) as client:
        result = {}
        slow = threading.Thread(target=lambda: result.update(r=client.post(
            "/v1/completions", json={"model": "fake", "prompt": prompt, "max_tokens": 2})))
        slow.start()
        latencies = health_latencies(client, slow)
        slow.join()
    assert result["r"].status_code == 200, result["r"].text
    assert result["r"].json()["usage"]["prompt_tokens"] > 100_000
    assert max(latencies) < 1.0, f"/health took up to {max(latencies):.3f} s"


def test_cancel_encodes_abandons_a_long_encode(demo_dir):
    tok = Tokenizer.from_dir(demo_dir)
    failure = {}

    def encode():
        try:
            tok.encode("many words to tokenize " * 400_000)
        except EncodeCancelled as exc:
            failure["exc"] = exc

    worker = threading.Thread(target=encode)
    worker.start()
    time.sleep(0.3)
    start = time.monotonic()
    tok.cancel_encodes()
    worker.join(timeout=5)
    assert not worker.is_alive() and "exc" in failure
    assert time.monotonic() - start < 1
    text = "later encodes still run " * 4000
    assert tok.encode(text) == tok.backend.encode(text, add_special_tokens=False).ids


def test_shutdown_does_not_wait_for_a_long_tokenization(demo_dir):
    app = create_app(engine_with_real_tokenizer(demo_dir, 100_000_000),
                     ServerConfig(served_model_names=["fake"], access_log=False))
    srv = ServerThread(app).__enter__()
    result = {}

    def post():
        try:
            result["r"] = httpx.post(f"{srv.url}/v1/completions", timeout=60, json={
                "model": "fake", "prompt": "many words to tokenize " * 400_000, "max_tokens": 2})
        except httpx.HTTPError as exc:
            result["r"] = exc

    client = threading.Thread(target=post)
    client.start()
    time.sleep(1.0)
    start = time.monotonic()
    srv.__exit__(None, None, None)
    assert time.monotonic() - start < 2, "the server waited for the tokenizer to finish"
    client.join(timeout=10)
    r = result["r"]
    assert isinstance(r, httpx.HTTPError) or r.status_code == 503
