"""Anthropic Messages agent loop with the official SDK: tool_use, tool_result, final answer,
thinking blocks (scripted model, real Qwen3 tokenizer and template)."""

from __future__ import annotations

import anthropic
import pytest

from test_agent_support import ANSWER, agent_server, tool_then_answer

THOUGHT = "Need the weather tool."
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL = {"name": "get_weather", "description": "Current weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}


@pytest.fixture(scope="module")
def client():
    with agent_server(tool_then_answer(think=THOUGHT)) as srv:
        yield anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=60)


def ask(client, messages, **kw):
    return client.messages.create(model="agent", max_tokens=200, messages=messages,
                                  tools=[TOOL], **kw)


def result_turn(message, result: str = "sunny, 24 C") -> list[dict]:
    blocks = [b.model_dump(exclude_none=True) for b in message.content]
    use = next(b for b in message.content if b.type == "tool_use")
    return [{"role": "assistant", "content": blocks},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": [{"type": "text", "text": result}]}]}]


def test_agent_loop(client):
    first = ask(client, USER)
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    thinking, use = first.content
    assert thinking.thinking == THOUGHT and thinking.signature
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    assert use.id.startswith("call_")
    final = ask(client, USER + result_turn(first))
    assert final.stop_reason == "end_turn"
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[1].text == ANSWER


def test_agent_loop_streamed(client):
    with client.messages.stream(model="agent", max_tokens=200, messages=USER, tools=[TOOL]
                                ) as stream:
        events = list(stream)
        first = stream.get_final_message()
    kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in events]
    assert ("content_block_delta", "thinking_delta") in kinds
    assert ("content_block_delta", "signature_delta") in kinds
    assert ("content_block_delta", "input_json_delta") in kinds
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "tool_use"]
    assert first.stop_reason == "tool_use"
    assert first.content[0].thinking == THOUGHT
    assert first.content[1].input == {"city": "Paris"}
    with client.messages.stream(model="agent", max_tokens=200, tools=[TOOL],
                                messages=USER + result_turn(first)) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == ANSWER and final.stop_reason == "end_turn"


def test_tool_choice_none_offers_no_tools(client):
    message = ask(client, USER, tool_choice={"type": "none"})
    assert all(b.type != "tool_use" for b in message.content)
    count = client.messages.count_tokens(model="agent", messages=USER, tools=[TOOL])
    bare = client.messages.count_tokens(model="agent", messages=USER)
    assert count.input_tokens > bare.input_tokens
