"""Requests that end early free their sequences; a preempting load keeps every answer exact."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import openai
import pytest

from atlas_core.engine import SamplingParams
from atlas_core.server import ServerConfig, create_app
from atlas_core.server.launch import ServerThread
from test_server_support import FakeAsyncEngine, tiny_engine, wait_until

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Count to one hundred."}],
        "max_tokens": 200, "temperature": 0}


def idle(engine) -> bool:
    stats = engine.stats()
    return stats.num_running == 0 and stats.num_waiting == 0 and stats.num_kv_blocks_used == 0


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")


def test_disconnect_mid_stream_frees_the_sequence(tiny_dir):
    engine = tiny_engine(tiny_dir, max_seq_len=512)
    long_chat = {**CHAT, "max_tokens": 400, "ignore_eos": True}
    with ServerThread(create_app(engine, ServerConfig(served_model_names=["tiny"]))) as srv:
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            with client.stream("POST", "/v1/chat/completions", json={**long_chat, "stream": True}) as r:
                lines = r.iter_lines()
                for _ in range(6):
                    next(lines)
                assert engine.stats().num_running == 1
            assert wait_until(lambda: idle(engine)), engine.stats()
            # A non-streaming client that hangs up while its request is running.
            host, port = srv.url.removeprefix("http://").split(":")
            body = json.dumps(long_chat).encode()
            generated = engine.stats().num_generation_tokens
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n"
                             b"content-type: application/json\r\n"
                             + f"content-length: {len(body)}\r\n\r\n".encode() + body)
                assert wait_until(lambda: engine.stats().num_running == 1), engine.stats()
            assert wait_until(lambda: idle(engine)), engine.stats()
            assert engine.stats().num_generation_tokens - generated < 400, "not aborted"
            assert client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2}).is_success
    engine.shutdown()


def test_request_timeout_aborts():
    engine = FakeAsyncEngine(delay=0.02)
    config = ServerConfig(served_model_names=["tiny"], request_timeout=0.2)
    with ServerThread(create_app(engine, config)) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
        out = client.chat.completions.create(**CHAT)
        assert out.choices[0].finish_reason == "abort"
        assert 0 < out.usage.completion_tokens < 200
        chunks = list(client.chat.completions.create(**CHAT, stream=True))
        assert chunks[-1].choices[0].finish_reason == "abort"
        assert wait_until(lambda: not engine.running)


def alone(engine, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """Greedy tokens of one prompt run by itself on the (sync) engine."""
    engine.add_request("alone", prompt_ids, SamplingParams(max_tokens=max_tokens, temperature=0,
                                                           ignore_eos=True))
    tokens = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens = out.outputs[0].token_ids
    return tokens


def test_64_concurrent_streams_with_preemption(tiny_dir):
    num, max_tokens = 64, 12
    engine = tiny_engine(tiny_dir, num_kv_blocks=40, max_seq_len=128, max_num_seqs=64,
                         enable_prefix_caching=False)
    prompts = [f"Request {i}: say something about the number {i * 7}." for i in range(num)]
    tok = engine.engine.tokenizer
    ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
    expected = [alone(engine.engine, p, max_tokens) for p in ids]
    with ServerThread(create_app(engine, ServerConfig(served_model_names=["tiny"]))) as srv:
        client = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0,
                                    timeout=60)

        async def one(prompt_ids):
            stream = await client.completions.create(
                model="tiny", prompt=prompt_ids, max_tokens=max_tokens, temperature=0,
                stream=True, logprobs=0, extra_body={"ignore_eos": True})
            tokens = []
            async for chunk in stream:
                for choice in chunk.choices:
                    tokens += choice.logprobs.tokens if choice.logprobs else []
            return tokens

        async def run_all():
            return await asyncio.wait_for(asyncio.gather(*(one(p) for p in ids)), 60)
        start = time.monotonic()
        results = asyncio.run(run_all())
        elapsed = time.monotonic() - start
        for got, want in zip(results, expected):
            assert got == [tok.decode([t], skip_special_tokens=False) for t in want]
        stats = engine.stats()
        assert stats.num_preemptions > 0, "the KV pool was meant to force preemption"
        assert wait_until(lambda: idle(engine)), engine.stats()
        metrics = httpx.get(f"{srv.url}/metrics").text
        assert "atlas_kv_cache_blocks_used 0.0" in metrics
        assert "atlas_num_requests_running 0.0" in metrics
        assert f'atlas_requests_total{{endpoint="/v1/completions",status="200"}} {num}.0' in metrics
        assert f"atlas_e2e_request_latency_seconds_count {num}.0" in metrics
    engine.shutdown()
    assert elapsed < 60
