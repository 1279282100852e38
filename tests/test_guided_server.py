"""Structured outputs and forced tool calls through the server with the official OpenAI SDK
(the examples of docs/structured-outputs.md, on a tiny random Qwen3)."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest

from atlas_core.server import ServerConfig, create_app
from atlas_core.server.launch import ServerThread
from test_server_support import tiny_engine

pytestmark = pytest.mark.timeout(120)

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["name", "age", "tags"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    engine = tiny_engine(tmp_path_factory.mktemp("tiny-guided"), max_seq_len=512)
    app = create_app(engine, ServerConfig(served_model_names=["tiny"], tool_call_parser="hermes"))
    with ServerThread(app) as srv:
        yield srv
    engine.shutdown()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.mark.parametrize("seed", range(3))
def test_response_format_json_schema(client, seed):
    reply = client.chat.completions.create(
        model="tiny", messages=USER, temperature=1.0, seed=seed, max_tokens=200,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_response_format_json_object_streams(client):
    chunks = client.chat.completions.create(
        model="tiny", messages=USER, temperature=1.0, seed=1, max_tokens=30, stream=True,
        response_format={"type": "json_object"})
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("{")


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function",
                                                      "function": {"name": "get_weather"}}])
def test_forced_tool_call(client, tool_choice):
    reply = client.chat.completions.create(
        model="tiny", messages=USER, temperature=1.0, seed=2, max_tokens=200, tools=[WEATHER],
        tool_choice=tool_choice, parallel_tool_calls=False)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_invalid_schema_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="invalid JSON schema"):
        client.chat.completions.create(
            model="tiny", messages=USER, max_tokens=5,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "x", "schema": {"type": "objectx"}}})


def test_anthropic_forced_tool_use(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}
    message = client.messages.create(
        model="tiny", max_tokens=200, messages=USER, tools=[tool],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True})
    assert message.stop_reason == "tool_use"
    (block,) = message.content
    assert block.type == "tool_use" and block.name == "get_weather"
    jsonschema.validate(block.input, tool["input_schema"])
