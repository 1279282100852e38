"""Streamed tool-call arguments through the official SDKs (OpenAI chat, Anthropic, Responses):
the scripted model writes a call token by token; more than one argument delta must arrive and
they must concatenate to the final arguments."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from test_agent_support import WEATHER_TOOL, agent_server, qwen3_tokenizer

ARGS = '{"city": "Paris", "unit": "celsius", "days": 3}'
CALL = '<tool_call>\n{"name": "get_weather", "arguments": ' + ARGS + '}\n</tool_call>'
BAD = '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris, "days": 3}}\n</tool_call>'
REPLIES = {"call": "Let me check.\n" + CALL, "bad": BAD}
ANTHROPIC_TOOL = {"name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}
RESPONSES_TOOL = {"type": "function", "name": "get_weather",
                  "parameters": WEATHER_TOOL["function"]["parameters"]}


def reply(prompt: list[int]) -> str:
    text = qwen3_tokenizer().decode(prompt, skip_special_tokens=False)
    return next(r for k, r in REPLIES.items() if f"[{k}]" in text)


@pytest.fixture(scope="module")
def server():
    with agent_server(reply) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=60)


def user(kind: str) -> list[dict]:
    return [{"role": "user", "content": f"[{kind}] Weather in Paris?"}]


def chat_stream(client, kind: str, **kw):
    heads, pieces, finish = [], [], None
    kw = {"max_tokens": 200, **kw}
    for chunk in client.chat.completions.create(model="agent", messages=user(kind), stream=True,
                                                tools=[WEATHER_TOOL], **kw):
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or []:
                if tc.id:
                    heads.append(tc)
                    assert tc.function.arguments == "" and tc.type == "function"
                elif tc.function.arguments:
                    pieces.append(tc.function.arguments)
            finish = choice.finish_reason or finish
    return heads, pieces, finish


def test_openai_chat_streams_argument_deltas(client):
    heads, pieces, finish = chat_stream(client, "call")
    assert [(h.index, h.function.name) for h in heads] == [(0, "get_weather")]
    assert len(pieces) > 1 and "".join(pieces) == ARGS and finish == "tool_calls"
    whole = client.chat.completions.create(model="agent", messages=user("call"),
                                           tools=[WEATHER_TOOL], max_tokens=200)
    assert whole.choices[0].message.tool_calls[0].function.arguments == ARGS
    with client.chat.completions.stream(model="agent", messages=user("call"),
                                        tools=[WEATHER_TOOL], max_tokens=200) as helper:
        final = helper.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.arguments == ARGS


def test_openai_chat_cut_off_call_ends_with_length(client):
    heads, pieces, finish = chat_stream(client, "call", max_tokens=18)
    assert len(heads) == 1 and finish == "length"
    assert ARGS.startswith("".join(pieces)) and "".join(pieces) != ARGS


def test_anthropic_streams_input_json_deltas(claude):
    kinds, partial = [], []
    with claude.messages.stream(model="agent", max_tokens=200, messages=user("call"),
                                tools=[ANTHROPIC_TOOL]) as stream:
        for event in stream:
            if event.type == "content_block_start":
                kinds.append(event.content_block.type)
                if event.content_block.type == "tool_use":
                    assert event.content_block.input == {}
            elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partial.append(event.delta.partial_json)
        final = stream.get_final_message()
    assert kinds == ["text", "tool_use"] and len(partial) > 1 and "".join(partial) == ARGS
    assert final.stop_reason == "tool_use" and final.content[1].input == json.loads(ARGS)
    whole = claude.messages.create(model="agent", max_tokens=200, messages=user("call"),
                                   tools=[ANTHROPIC_TOOL])
    assert whole.content[1].input == json.loads(ARGS)


def test_anthropic_malformed_arguments_keep_the_stream_parseable(claude):
    partial = []
    with claude.messages.stream(model="agent", max_tokens=200, messages=user("bad"),
                                tools=[ANTHROPIC_TOOL]) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partial.append(event.delta.partial_json)
        final = stream.get_final_message()
    assert '{"city": '.startswith("".join(partial)) and final.stop_reason == "tool_use"
    whole = claude.messages.create(model="agent", max_tokens=200, messages=user("bad"),
                                   tools=[ANTHROPIC_TOOL])
    assert whole.content[0].input == {"arguments": '{"city": Paris, "days": 3}'}


def test_responses_streams_function_call_argument_deltas(client):
    added, pieces, done = [], [], []
    for event in client.responses.create(model="agent", input=user("call"), stream=True,
                                         tools=[RESPONSES_TOOL]):
        if event.type == "response.output_item.added" and event.item.type == "function_call":
            added.append(event.item)
        elif event.type == "response.function_call_arguments.delta":
            pieces.append(event.delta)
        elif event.type == "response.function_call_arguments.done":
            done.append(event.arguments)
        elif event.type == "response.completed":
            final = event.response
    assert [(a.name, a.arguments) for a in added] == [("get_weather", "")]
    assert len(pieces) > 1 and "".join(pieces) == ARGS and done == [ARGS]
    assert [i.arguments for i in final.output if i.type == "function_call"] == [ARGS]


def test_responses_cut_off_call_is_incomplete(client):
    final = None
    for event in client.responses.create(model="agent", input=user("call"), stream=True,
                                         tools=[RESPONSES_TOOL], max_output_tokens=18):
        if event.type == "response.incomplete":
            final = event.response
    call = final.output[-1]
    assert final.status == "incomplete" and call.type == "function_call"
    assert call.status == "incomplete" and ARGS.startswith(call.arguments)
