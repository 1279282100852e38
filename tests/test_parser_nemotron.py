"""Nemotron tool calls and reasoning: Nano-v2's ``<TOOLCALL>[...]</TOOLCALL>`` (whole and
streamed parsing agree under any chunking, the markup the real template renders reads back as
the same calls) and Nemotron-3's chat template (auto-selected XML calls, ``<think>``)."""

from __future__ import annotations

import json
import random

import pytest

from atlas_core.parsers import (default_reasoning_parser_for, default_tool_parser_for,
                                get_tool_parser)
from atlas_core.testing.fixtures import real_models_dir
from atlas_core.tokenizer import render_chat_template

from test_parser_support import streamed

V2 = real_models_dir() / "nemotron" / "NVIDIA-Nemotron-Nano-v2.jinja"
NANO3 = real_models_dir() / "nemotron" / "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja"
CALL = ('<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
        '{"name": "get_time", "arguments": "{\\"tz\\": \\"CET\\"}"}]</TOOLCALL>')
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}


def parser():
    return get_tool_parser("nemotron_v2")([WEATHER])


def test_list_of_calls_with_object_and_string_arguments():
    out = parser().parse("Let me check.\n" + CALL)
    assert out.content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "CET"})]
    assert len({c.id for c in out.tool_calls}) == 2


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_streaming_equals_whole(seed):
    text = "Sure.\n" + CALL + "\n"
    whole = parser().parse(text)
    content, calls = streamed(parser(), text, None if seed is None else random.Random(seed))
    assert content == whole.content
    assert calls == [(c.name, c.arguments) for c in whole.tool_calls]


def test_not_a_call_and_cut_off_calls():
    junk = "<TOOLCALL>not json</TOOLCALL>"
    assert parser().parse(junk).content == junk and not parser().parse(junk).tool_calls
    cut = parser().parse('<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Par')
    assert [c.name for c in cut.tool_calls] == ["get_weather"]
    assert cut.tool_calls[0].arguments.startswith('{"city": "Par')
    head_only = parser().parse('<TOOLCALL>[{"na')
    assert head_only.content == '<TOOLCALL>[{"na' and not head_only.tool_calls


def test_fuzz_streaming_equals_whole():
    rng = random.Random(11)
    parts = [CALL, "<TOOLCALL>", "</TOOLCALL>", "[", "]", '{"name": "f", "arguments": {}}',
             ", ", "{", "}", "\n", "x", "<", "é"]
    for _ in range(200):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(1, 8)))
        whole = parser().parse(text)
        expected = (whole.content, [(c.name, c.arguments) for c in whole.tool_calls])
        assert streamed(parser(), text, random.Random(len(text))) == expected, text


fixtures = pytest.mark.skipif(not V2.is_file(), reason="real-model fixtures not present")


@fixtures
def test_v2_template_markup_reads_back_as_the_same_calls():
    calls = [{"id": "a", "type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}},
        {"id": "b", "type": "function", "function": {"name": "get_time", "arguments": {}}}]
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "Checking.", "tool_calls": calls},
                {"role": "user", "content": "thanks"}]
    text = render_chat_template(V2.read_text(encoding="utf-8"), messages)
    reply = text.split("<SPECIAL_11>Assistant\n", 1)[1].split("\n<SPECIAL_12>", 1)[0]
    out = parser().parse(reply)
    assert out.content == "Checking."
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in calls]


@fixtures
def test_default_parsers_for_the_real_templates():
    v2, nano3 = V2.read_text(encoding="utf-8"), NANO3.read_text(encoding="utf-8")
    assert default_tool_parser_for("nemotron_h", v2) == "nemotron_v2"
    assert default_tool_parser_for("nemotron_h", nano3) == "qwen3_coder"
    assert default_reasoning_parser_for(v2) == default_reasoning_parser_for(nano3) == "think"


@fixtures
def test_nano3_template_markup_reads_back_as_the_same_calls():
    calls = [{"id": "a", "type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}]
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "Checking.", "tool_calls": calls},
                {"role": "user", "content": "thanks"}]
    text = render_chat_template(NANO3.read_text(encoding="utf-8"), messages, tools=[WEATHER])
    reply = text.split("<|im_start|>assistant\n", 1)[1].split("<|im_end|>", 1)[0]
    reply = reply.split("</think>", 1)[-1]
    out = get_tool_parser("qwen3_coder")([WEATHER]).parse(reply)
    assert out.content.strip() == "Checking."
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("get_weather", {"city": "Zürich", "days": 2})]
