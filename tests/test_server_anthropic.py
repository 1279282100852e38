"""The Anthropic SDK against a real server and engine (tiny random Qwen3, numpy backend)."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from atlas_core.server import ServerConfig, create_app
from atlas_core.server.launch import ServerThread
from test_server_support import FakeAsyncEngine, tiny_engine, wait_until

USER = [{"role": "user", "content": "Write a haiku about the sea."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    engine = tiny_engine(tmp_path_factory.mktemp("tiny"), max_seq_len=512)
    with ServerThread(create_app(engine, ServerConfig(served_model_names=["tiny"]))) as srv:
        yield srv
    engine.shutdown()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=30)


def create(client, **kw):
    # The tiny model's generation_config is greedy; this SDK has no sampling arguments, so
    # temperature / top_p / top_k travel in extra_body.
    return client.messages.create(**{"model": "tiny", "max_tokens": 8, "messages": USER, **kw})


def test_message_basic(client):
    msg = create(client)
    assert msg.type == "message" and msg.role == "assistant" and msg.model == "tiny"
    assert msg.content[0].type == "text" and msg.stop_reason == "max_tokens"
    assert msg.usage.output_tokens == 8 and msg.usage.input_tokens > 0
    again = create(client)
    assert again.content[0].text == msg.content[0].text
    total = again.usage.input_tokens + again.usage.cache_read_input_tokens
    assert total == msg.usage.input_tokens + msg.usage.cache_read_input_tokens
    assert again.usage.cache_read_input_tokens > 0


def test_system_blocks_and_multi_turn(client):
    as_string = create(client, system="You are terse.")
    as_blocks = create(client, system=[{"type": "text", "text": "You are terse."}])
    assert as_string.content[0].text == as_blocks.content[0].text
    turns = [{"role": "user", "content": "Hi"},
             {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
             {"role": "user", "content": [{"type": "text", "text": "More?"}]}]
    assert create(client, messages=turns).usage.output_tokens == 8


def test_stream_matches_create(client):
    whole = create(client, max_tokens=10).content[0].text
    events = []
    with client.messages.stream(model="tiny", max_tokens=10, messages=USER) as stream:
        for event in stream:
            events.append(event.type)
        final = stream.get_final_message()
    assert final.content[0].text == whole and final.stop_reason == "max_tokens"
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_start" in events and "content_block_stop" in events
    assert "message_delta" in events
    assert final.usage.output_tokens == 10


def test_stop_sequences(client):
    text = create(client, max_tokens=12).content[0].text
    stop = text[3:6]
    if not stop.strip() or "\ufffd" in stop:
        pytest.skip("greedy text has no usable stop substring")
    msg = create(client, max_tokens=12, stop_sequences=[stop])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert msg.content[0].text == text[:text.index(stop)]


def test_sampling_fields(client):
    a = create(client, extra_body={"temperature": 1.0, "top_p": 0.9, "top_k": 20})
    assert a.usage.output_tokens == 8
    with pytest.raises(anthropic.BadRequestError):
        create(client, extra_body={"temperature": 1.5})


def test_count_tokens(client):
    count = client.messages.count_tokens(model="tiny", messages=USER, system="Be kind.")
    msg = create(client, system="Be kind.", max_tokens=1)
    assert count.input_tokens == msg.usage.input_tokens + msg.usage.cache_read_input_tokens


def test_tool_blocks_render(client):
    turns = [{"role": "user", "content": "weather?"},
             {"role": "assistant", "content": [
                 {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Oslo"}}]},
             {"role": "user", "content": [
                 {"type": "tool_result", "tool_use_id": "t1", "content": "rain"}]}]
    tools = [{"name": "weather", "description": "get weather",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    assert create(client, messages=turns, tools=tools, max_tokens=2).usage.output_tokens == 2


def test_pings_while_idle():
    engine = FakeAsyncEngine(delay=0.06)
    config = ServerConfig(served_model_names=["fake"], ping_interval=0.02)
    with ServerThread(create_app(engine, config)) as srv:
        with httpx.stream("POST", f"{srv.url}/v1/messages", timeout=10, json={
                "model": "fake", "max_tokens": 3, "stream": True, "messages": USER}) as r:
            lines = [ln for ln in r.iter_lines() if ln.startswith("event: ")]
    assert "event: ping" in lines
    assert lines[-1] == "event: message_stop"


def test_timeout_in_stream_is_an_error_event():
    engine = FakeAsyncEngine(delay=0.02)
    config = ServerConfig(served_model_names=["fake"], request_timeout=0.2)
    with ServerThread(create_app(engine, config)) as srv:
        client = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as info:
            create(client, model="fake", max_tokens=200)
        assert info.value.status_code == 504
        with httpx.stream("POST", f"{srv.url}/v1/messages", timeout=10, json={
                "model": "fake", "max_tokens": 200, "stream": True, "messages": USER}) as r:
            body = r.read().decode()
        assert "event: error" in body and "timeout_error" in body
        # the stream's clean-up may finish just after its last byte reached the client
        assert wait_until(lambda: not engine.running)
