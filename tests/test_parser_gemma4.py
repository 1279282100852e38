"""Gemma-4 tool calls and thinking: the parser reads back what the real chat template writes."""

import json

import pytest

from atlas_core.parsers import (default_reasoning_parser_for, default_tool_parser_for,
                                get_reasoning_parser, get_tool_parser)
from atlas_core.parsers.gemma4 import GemmaArgumentError, parse_gemma_arguments
from atlas_core.testing.fixtures import real_models_dir
from atlas_core.tokenizer import render_chat_template

TEMPLATE = real_models_dir() / "gemma-4" / "chat_template.jinja"
needs_template = pytest.mark.skipif(not TEMPLATE.is_file(),
                                    reason="real-model fixtures not present")

ARGUMENTS = [
    {"city": "Paris, FR", "days": 3},
    {"query": "a {b} [c], d:e", "limit": 2.5, "exact": False, "tags": ["x", "y"]},
    {"filter": {"min": -1, "names": ["Zürich"], "deep": {"on": True}}, "note": ""},
    {},
]


def _rendered_call(name, arguments):
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    text = render_chat_template(TEMPLATE.read_text(), [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]}], bos_token="<bos>")
    start = text.index("<|tool_call>")
    return text[start:text.index("<tool_call|>") + len("<tool_call|>")]


@needs_template
@pytest.mark.parametrize("arguments", ARGUMENTS)
def test_calls_rendered_by_the_template_parse_back(arguments):
    markup = _rendered_call("get_weather", arguments)
    parsed = get_tool_parser("gemma4")().parse("Checking." + markup)
    assert parsed.content == "Checking."
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("get_weather", arguments)]


@needs_template
def test_any_chunking_streams_the_same_calls():
    text = "Sure." + _rendered_call("a", ARGUMENTS[1]) + _rendered_call("b", ARGUMENTS[2])
    whole = get_tool_parser("gemma4")().parse(text)
    for size in (1, 3, 7):
        parser = get_tool_parser("gemma4")()
        events = [parser.feed(text[i:i + size]) for i in range(0, len(text), size)]
        events.append(parser.finish())
        content = "".join(e.content for e in events)
        calls = [c for e in events for c in e.tool_calls]
        assert content == whole.content == "Sure."
        assert [c.name for c in calls] == ["a", "b"]
        assert [c.arguments for c in calls] == [c.arguments for c in whole.tool_calls]


def test_malformed_call_is_content_not_an_error():
    text = "<|tool_call>call:f{x:<|\"|>open}<tool_call|>"
    parsed = get_tool_parser("gemma4")().parse(text)
    assert parsed.tool_calls == [] and parsed.content == text


@pytest.mark.parametrize("bad", ["x:1}", "{x 1}", "{x:1", "{x:[1 2}", "{x:}", "{x:1} tail"])
def test_argument_syntax_errors_are_reported(bad):
    with pytest.raises(GemmaArgumentError):
        parse_gemma_arguments(bad)


def test_bare_words_are_read_leniently():
    assert parse_gemma_arguments("{a:1e3,b:null,c:two words}") == {"a": 1000.0, "b": None,
                                                                    "c": "two words"}


def test_thinking_channel_is_reasoning():
    parsed = get_reasoning_parser("gemma4")().parse(
        "<|channel>thought\nAdd them.\n<channel|>The answer is 4.")
    assert (parsed.reasoning, parsed.content) == ("Add them.", "The answer is 4.")


@needs_template
def test_the_template_selects_the_gemma4_parsers():
    source = TEMPLATE.read_text()
    assert default_tool_parser_for(None, source) == "gemma4"
    assert default_reasoning_parser_for(source) == "gemma4"
    assert default_tool_parser_for("gemma4_text") == "gemma4"
