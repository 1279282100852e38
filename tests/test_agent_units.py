"""Units of the server's agent layer: tool and tool_choice conversion, thinking precedence,
Responses input items, the response store, output shaping and rendering."""

from __future__ import annotations

import json

import pytest

from atlas_core.testing.fixtures import real_models_dir
from atlas_core.parsers import HermesToolParser, ParserEvents, ReasoningParser, ToolCallDelta
from atlas_core.server import ServerConfig
from atlas_core.server.agent import _markers_are_special
from atlas_core.server.anthropic_blocks import AnthropicBlocks, tool_input
from atlas_core.server.errors import APIError
from atlas_core.server.responses_input import input_messages
from atlas_core.server.responses_output import ResponsesOutput
from atlas_core.server.responses_store import ResponseStore, StoredResponse
from atlas_core.server.shaping import OutputShaper, ParsePlan
from atlas_core.server.state import choose_parsers
from atlas_core.server.thinking import ThinkingRequest, budget_params, from_anthropic, \
    resolve_thinking
from atlas_core.server.tools import (anthropic_tool_choice, anthropic_tools, openai_tool_choice,
                                     responses_tools, template_tool_calls)
from test_agent_support import qwen3_tokenizer

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}}


def test_tool_shapes_converge():
    expected = [{"type": "function", "function": {"name": "f", "parameters": SCHEMA,
                                                  "description": "d"}}]
    assert anthropic_tools([{"name": "f", "description": "d", "input_schema": SCHEMA}]) == expected
    assert responses_tools([{"type": "function", "name": "f", "description": "d",
                             "parameters": SCHEMA}]) == expected
    with pytest.raises(APIError, match="web_search"):
        responses_tools([{"type": "web_search"}])
    with pytest.raises(APIError, match="bash_20250124"):
        anthropic_tools([{"type": "bash_20250124", "name": "bash"}])


def test_tool_choices():
    tools = responses_tools([{"type": "function", "name": "f"}])
    assert openai_tool_choice(None, tools).mode == "auto"
    assert openai_tool_choice(None, None).mode == "none"
    assert openai_tool_choice({"type": "function", "name": "f"}, tools).name == "f"
    assert openai_tool_choice({"type": "function", "function": {"name": "f"}}, tools).is_forced
    with pytest.raises(APIError, match="not among"):
        openai_tool_choice({"type": "function", "name": "g"}, tools)
    with pytest.raises(APIError, match="tool_choice must be"):
        openai_tool_choice("sometimes", tools)
    choice, parallel = anthropic_tool_choice({"type": "any", "disable_parallel_tool_use": True},
                                             tools)
    assert choice.mode == "required" and parallel is False
    assert anthropic_tool_choice({"type": "tool", "name": "f"}, tools)[0].mode == "named"


def test_template_tool_calls_parse_arguments():
    calls = template_tool_calls([{"id": "a", "type": "function",
                                  "function": {"name": "f", "arguments": '{"q": "x"}'}},
                                 {"id": "b", "function": {"name": "f", "arguments": "{oops"}}])
    assert calls[0]["function"]["arguments"] == {"q": "x"}
    assert calls[1]["function"]["arguments"] == "{oops"


@pytest.mark.parametrize("config, asked, kwargs, expect", [
    ({}, ThinkingRequest(), None, ({}, None)),
    ({"reasoning_budget": 9}, ThinkingRequest(), None, ({}, 9)),
    ({"reasoning_budget": 9}, ThinkingRequest(True, 3), None, ({"enable_thinking": True}, 3)),
    ({"default_thinking": False}, ThinkingRequest(), None, ({"enable_thinking": False}, None)),
    ({}, ThinkingRequest(True, 3), {"enable_thinking": False}, ({"enable_thinking": False}, None)),
    ({"disable_thinking": True}, ThinkingRequest(True), {"enable_thinking": True},
     ({"enable_thinking": False}, None)),
])
def test_thinking_precedence(config, asked, kwargs, expect):
    cfg = ServerConfig(served_model_names=["m"], **config)
    assert resolve_thinking(cfg, asked, kwargs) == expect


def test_anthropic_thinking_fields():
    assert from_anthropic({"type": "enabled", "budget_tokens": 5}) == ThinkingRequest(True, 5)
    assert from_anthropic({"type": "disabled"}).enabled is False
    with pytest.raises(APIError, match="budget_tokens"):
        from_anthropic({"type": "enabled", "budget_tokens": -1})


def test_budget_params_use_template_tokens():
    tok = qwen3_tokenizer()
    params = budget_params(tok, ReasoningParser(), False, 7)
    assert params == {"thinking_budget": 7, "thinking_start_token_ids": [151667],
                      "thinking_end_token_ids": [151668, 271]}
    assert budget_params(tok, ReasoningParser(), True, 7)["thinking_start_token_ids"] == []
    assert budget_params(tok, None, False, 7) == {} == budget_params(tok, ReasoningParser(),
                                                                      False, None)


def test_parsers_chosen_per_model():
    cfg = ServerConfig(served_model_names=["m"])
    template = qwen3_tokenizer().chat_template
    assert choose_parsers(cfg, template, None) == (HermesToolParser, ReasoningParser)
    assert choose_parsers(cfg, None, "llama")[0].name == "llama3_json"
    off = ServerConfig(served_model_names=["m"], tool_call_parser=None, reasoning_parser=None)
    assert choose_parsers(off, template, "qwen3") == (None, None)
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        ServerConfig(served_model_names=["m"], tool_call_parser="nope")


def test_special_markers_detected():
    from atlas_core.tokenizer import Tokenizer
    llama = Tokenizer.from_dir(real_models_dir() / "llama-3")
    assert _markers_are_special(llama, ["<|python_tag|>"])
    assert not _markers_are_special(qwen3_tokenizer(), ["<tool_call>", "<think>"])


def test_responses_items_to_messages():
    items = [{"role": "developer", "content": "rules"},
             {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
             {"type": "reasoning", "id": "rs_1", "summary": [],
              "content": [{"type": "reasoning_text", "text": "think"}]},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"q": 1}'},
             {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "one"},
             {"type": "function_call_output", "call_id": "c2", "output": "two"}]
    messages = input_messages(items)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
    turn = messages[2]
    assert turn["content"] == "Checking." and turn["reasoning_content"] == "think"
    assert [c["id"] for c in turn["tool_calls"]] == ["c1", "c2"]
    assert turn["tool_calls"][0]["function"]["arguments"] == {"q": 1}
    image = input_messages([{"role": "user", "content": [{"type": "input_image"}]}])
    assert image[0]["content"][0]["type"] == "image"
    assert image[0]["content"][0]["image"].param == "input[0].content[0]"


def test_response_store_is_lru():
    store = ResponseStore(2)
    for name in "abc":
        if name == "c":
            assert store.get("a") is not None
        store.put(name, StoredResponse({"id": name}, []))
    assert store.get("b") is None and store.get("a") and store.get("c") and len(store) == 2
    ResponseStore(0).put("x", StoredResponse({}, []))


def test_shaper_whole_equals_streamed():
    text = ("<think>\nhm\n</think>\n\nSure.\n"
            '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')
    plan = ParsePlan(HermesToolParser, None, ReasoningParser)
    whole = OutputShaper(plan)
    whole.feed_all(text)
    streamed = OutputShaper(plan)
    for ch in text:
        streamed.feed(ch)
    streamed.finish()
    for shaper in (whole, streamed):
        assert (shaper.reasoning, shaper.content) == ("hm", "Sure.")
        assert [c.name for c in shaper.tool_calls] == ["f"]
        assert shaper.finish_reason("stop") == "tool_calls"
        assert shaper.finish_reason("length") == "length"


def test_block_renderers_order_and_close():
    events = ParserEvents("Hi", "why", [ToolCallDelta(0, "call_1", "f", '{"a": 1}')])
    blocks = AnthropicBlocks()
    blocks.add(events)
    blocks.finish()
    assert [b["type"] for b in blocks.blocks] == ["thinking", "text", "tool_use"]
    assert blocks.blocks[0]["signature"] and blocks.blocks[2]["input"] == {"a": 1}
    assert tool_input("[1]") == {"value": [1]}
    output = ResponsesOutput()
    stream = output.add(events) + output.finish()
    assert [i["type"] for i in output.items] == ["reasoning", "message", "function_call"]
    assert all(i["status"] == "completed" for i in output.items)
    assert sum(e["type"] == "response.output_item.done" for e in stream) == 3
    assert json.loads(output.items[2]["arguments"]) == {"a": 1}
