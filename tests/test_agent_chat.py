"""OpenAI chat agent loop with the official SDK: the model calls a tool, the client answers,
the model finishes (scripted model, real Qwen3 tokenizer and template)."""

from __future__ import annotations

import json

import openai
import pytest

from test_agent_support import ANSWER, WEATHER_TOOL, agent_server, tool_then_answer

USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client():
    with agent_server(tool_then_answer(think="The user wants weather; call the tool.")) as srv:
        yield openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=60)


def ask(client, messages, **kw):
    return client.chat.completions.create(model="agent", messages=messages,
                                          tools=[WEATHER_TOOL], temperature=0, max_tokens=200,
                                          **kw)


def tool_turn(call, result: str = "sunny, 24 C") -> list[dict]:
    assistant = {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": call.function.name, "arguments": call.function.arguments}}]}
    return [assistant, {"role": "tool", "tool_call_id": call.id, "content": result}]


def test_agent_loop(client):
    first = ask(client, USER)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert not choice.message.content
    assert choice.message.reasoning_content == "The user wants weather; call the tool."
    assert choice.message.model_extra["reasoning"] == choice.message.reasoning_content
    final = ask(client, USER + tool_turn(call))
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == ANSWER
    assert final.choices[0].message.tool_calls is None


def collect(stream):
    content, reasoning, calls, finishes = "", "", {}, []
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            for tc in delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = entry["id"] or tc.id
                entry["name"] += (tc.function.name or "") if tc.function else ""
                entry["arguments"] += (tc.function.arguments or "") if tc.function else ""
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    return content, reasoning, calls, finishes


def test_agent_loop_streamed(client):
    content, reasoning, calls, finishes = collect(ask(client, USER, stream=True))
    assert finishes == ["tool_calls"] and content == ""
    assert reasoning == "The user wants weather; call the tool."
    assert calls[0]["id"].startswith("call_") and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    call = type("Call", (), {"id": calls[0]["id"], "function": type("F", (), {
        "name": "get_weather", "arguments": calls[0]["arguments"]})})
    content, _, calls, finishes = collect(ask(client, USER + tool_turn(call), stream=True))
    assert content == ANSWER and finishes == ["stop"] and calls == {}


def test_sdk_stream_helper_accumulates_tool_calls(client):
    with client.chat.completions.stream(model="agent", messages=USER, tools=[WEATHER_TOOL],
                                        temperature=0, max_tokens=200) as stream:
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
