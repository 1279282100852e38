"""Tool-call edge cases end to end: no markup leaks, text that is not a call and calls cut off
before their arguments began come back as content with a clear finish reason (never a 500), a
started call with malformed arguments keeps their raw text, parallel calls, tool_choice
none/required."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from test_agent_support import CALL, WEATHER_TOOL, agent_server

USER = [{"role": "user", "content": "Weather in Paris and Rome?"}]
ROME = CALL.replace("Paris", "Rome")
BAD = '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>'
NOT_A_CALL = '<tool_call>\n{"name": get_weather}\n</tool_call>'
REPLIES = {
    "mixed": "Let me check.\n" + CALL,
    "parallel": CALL + "\n" + ROME,
    "bad": BAD,
    "notcall": NOT_A_CALL,
    "think": "<think>\nMaybe <tool_call> later.\n</think>\n\nChecking.\n" + CALL,
}


def reply(prompt: list[int]) -> str:
    from test_agent_support import qwen3_tokenizer
    text = qwen3_tokenizer().decode(prompt, skip_special_tokens=False)
    kind = next((k for k in REPLIES if f"[{k}]" in text), "mixed")
    return REPLIES[kind]


@pytest.fixture(scope="module")
def server():
    with agent_server(reply) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)


def ask(client, kind: str, **kw):
    messages = [{"role": "user", "content": f"[{kind}] Weather in Paris and Rome?"}]
    return client.chat.completions.create(**{"model": "agent", "messages": messages,
                                             "tools": [WEATHER_TOOL], "max_tokens": 200, **kw})


def streamed(client, kind: str, **kw):
    content, reasoning, calls, finish = "", "", [], None
    for chunk in ask(client, kind, stream=True, **kw):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            calls += [tc for tc in choice.delta.tool_calls or [] if tc.id]
            finish = choice.finish_reason or finish
    return content, reasoning, calls, finish


def test_content_before_a_call_keeps_no_markup(client):
    choice = ask(client, "mixed").choices[0]
    assert choice.message.content == "Let me check."
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    content, _, calls, finish = streamed(client, "mixed")
    assert content == "Let me check." and len(calls) == 1 and finish == "tool_calls"


def test_markup_in_reasoning_stays_reasoning(client):
    choice = ask(client, "think").choices[0]
    assert choice.message.reasoning_content == "Maybe <tool_call> later."
    assert choice.message.content == "Checking."
    assert choice.message.tool_calls[0].function.name == "get_weather"
    content, reasoning, calls, _ = streamed(client, "think")
    assert (content, reasoning, len(calls)) == ("Checking.", "Maybe <tool_call> later.", 1)


def test_parallel_calls_and_parallel_false(client):
    calls = ask(client, "parallel").choices[0].message.tool_calls
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Rome"]
    assert len({c.id for c in calls}) == 2
    _, _, streamed_calls, _ = streamed(client, "parallel")
    assert [c.index for c in streamed_calls] == [0, 1]
    single = ask(client, "parallel", parallel_tool_calls=False).choices[0].message.tool_calls
    assert len(single) == 1


def test_malformed_call_is_content(client):
    choice = ask(client, "notcall").choices[0]
    assert choice.message.content == NOT_A_CALL and choice.finish_reason == "stop"
    assert choice.message.tool_calls is None
    content, _, calls, finish = streamed(client, "notcall")
    assert content == NOT_A_CALL and calls == [] and finish == "stop"


def test_started_call_with_bad_arguments_keeps_raw_text(client):
    choice = ask(client, "bad").choices[0]
    assert choice.message.content is None and choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.arguments == '{"city": Paris}'
    content, _, calls, finish = streamed(client, "bad")
    assert content == "" and len(calls) == 1 and finish == "tool_calls"


def test_truncated_call_is_content_with_length(client, server):
    choice = ask(client, "mixed", max_tokens=8).choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    assert choice.message.content.startswith("Let me check.\n<tool_call>")
    content, _, calls, finish = streamed(client, "mixed", max_tokens=8)
    assert content == choice.message.content and finish == "length" and calls == []
    messages = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    cut = messages.messages.create(model="agent", max_tokens=8, messages=[
        {"role": "user", "content": "[mixed] weather?"}], tools=[{
            "name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}])
    assert cut.stop_reason == "max_tokens" and [b.type for b in cut.content] == ["text"]


def test_tool_choice_none_leaves_tools_out(client):
    with_tools = ask(client, "mixed")
    without = ask(client, "mixed", tool_choice="none")
    assert without.usage.prompt_tokens < with_tools.usage.prompt_tokens
    assert without.choices[0].message.tool_calls is None
    assert without.choices[0].finish_reason == "stop"


def test_forced_tool_choice_is_constrained(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        result = ask(client, "parallel", tool_choice=choice).choices[0]
        assert result.finish_reason == "tool_calls"
        assert [c.function.name for c in result.message.tool_calls] == ["get_weather"] * 2
    single = ask(client, "parallel", tool_choice=named, parallel_tool_calls=False).choices[0]
    assert len(single.message.tool_calls) == 1 and single.finish_reason == "tool_calls"


def test_bad_tool_choice_and_tools(client):
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        ask(client, "mixed", tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(openai.BadRequestError, match="needs `tools`"):
        client.chat.completions.create(model="agent", messages=USER, tool_choice="required")
    with pytest.raises(openai.BadRequestError, match="tools must be"):
        ask(client, "mixed", tools=[{"type": "retrieval"}])
