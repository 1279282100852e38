"""Reasoning: ``<think>`` split into reasoning_content / thinking blocks, streamed and not;
thinking switched on and off by every API's field and the server flags; budgets end the
think block cleanly (scripted model, real Qwen3 tokenizer and template)."""

from __future__ import annotations

import anthropic
import openai
import pytest

from atlas_core.server.thinking import EFFORT_BUDGETS, from_effort
from test_agent_support import IM_END, agent_server, output_start, qwen3_tokenizer

THOUGHT = "Let me think about <b>this</b>."
EMPTY_THINK = "<think>\n\n</think>\n\n"
USER = [{"role": "user", "content": "Hi"}]


def on_or_off(prompt: list[int]) -> str:
    """Think and say ON, unless the prompt rendered thinking off: then say OFF."""
    tail = qwen3_tokenizer().decode(prompt[-6:], skip_special_tokens=False)
    return "OFF" if tail.endswith(EMPTY_THINK) else f"<think>\n{THOUGHT}\n</think>\n\nON"


def chat(url, **kw):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
    return client.chat.completions.create(model="agent", messages=USER, **{"max_tokens": 100,
                                                                           **kw})


def test_split_whole_and_streamed():
    with agent_server(on_or_off) as srv:
        message = chat(srv.url).choices[0].message
        assert message.content == "ON" and message.reasoning_content == THOUGHT
        reasoning, content = "", ""
        for chunk in chat(srv.url, stream=True):
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is not None:
                extra = delta.model_extra or {}
                assert extra.get("reasoning") == extra.get("reasoning_content")
                reasoning += extra.get("reasoning_content") or ""
                content += delta.content or ""
        assert reasoning == THOUGHT and content == "ON"


@pytest.mark.parametrize("request_fields, config, expect", [
    ({}, {}, "ON"),
    ({"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}, {}, "OFF"),
    ({"reasoning_effort": "none"}, {}, "OFF"),
    ({}, {"default_thinking": False}, "OFF"),
    ({"reasoning_effort": "high"}, {"default_thinking": False}, "ON"),
    ({"extra_body": {"chat_template_kwargs": {"enable_thinking": True}}},
     {"disable_thinking": True}, "OFF"),
])
def test_thinking_switches(request_fields, config, expect):
    with agent_server(on_or_off, **config) as srv:
        message = chat(srv.url, **request_fields).choices[0].message
    assert message.content == expect
    assert (message.reasoning_content is None) == (expect == "OFF")


def test_anthropic_thinking_switch():
    with agent_server(on_or_off, default_thinking=False) as srv:
        client = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)
        on = client.messages.create(model="agent", max_tokens=100, messages=USER,
                                    thinking={"type": "enabled", "budget_tokens": 1024})
        off = client.messages.create(model="agent", max_tokens=100, messages=USER,
                                     thinking={"type": "disabled"})
    assert [b.type for b in on.content] == ["thinking", "text"]
    assert on.content[0].thinking == THOUGHT and on.content[1].text == "ON"
    assert [b.type for b in off.content] == ["text"] and off.content[0].text == "OFF"


def endless_thinker(context: list[int]) -> int | None:
    """Opens a think block and never closes it; once something closed it (``</think>`` and a
    blank line), answers DONE."""
    tok = qwen3_tokenizer()
    out = context[output_start(context):]
    close = tok.token_to_id("</think>")
    if not out:
        return tok.token_to_id("<think>")
    if close not in out:
        return tok.encode(" hmm")[0]
    answer = tok.encode("DONE") + [IM_END]
    k = len(out) - out.index(close) - 2
    return answer[k] if 0 <= k < len(answer) else None


def test_budget_ends_the_think_block():
    with agent_server(script=endless_thinker, reasoning_budget=6) as srv:
        result = chat(srv.url, max_tokens=40)
        message = result.choices[0].message
        assert message.reasoning_content == "hmm" + " hmm" * 5
        assert message.content == "DONE" and result.choices[0].finish_reason == "stop"
        client = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)
        with client.messages.stream(model="agent", max_tokens=40, messages=USER,
                                    thinking={"type": "enabled", "budget_tokens": 3}) as stream:
            message = stream.get_final_message()
    assert message.content[0].thinking == "hmm hmm hmm"
    assert message.content[1].text == "DONE" and message.stop_reason == "end_turn"


def test_effort_budgets():
    assert from_effort("low").budget == EFFORT_BUDGETS["low"] == 1024
    assert from_effort("none").enabled is False
    assert from_effort(None).enabled is None
    assert EFFORT_BUDGETS["minimal"] < EFFORT_BUDGETS["medium"] < EFFORT_BUDGETS["high"]


def test_unclosed_think_block_is_reasoning_with_length():
    with agent_server(script=endless_thinker) as srv:
        result = chat(srv.url, max_tokens=5)
    choice = result.choices[0]
    assert choice.finish_reason == "length" and not choice.message.content
    assert choice.message.reasoning_content == "hmm hmm hmm hmm"
