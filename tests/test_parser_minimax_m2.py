"""MiniMax-M2 tool calls (``<minimax:tool_call><invoke name=...><parameter name=...>``): whole
and streamed parsing agree under any chunking, values typed by the tool schema, the markup the
real chat template renders reads back as the same calls, and the format is picked by default
for that template."""

from __future__ import annotations

import json
import random

import pytest

from atlas_core.parsers import default_tool_parser_for, get_tool_parser
from atlas_core.testing.fixtures import real_models_dir
from atlas_core.tokenizer import render_chat_template

from test_parser_support import streamed

TEMPLATE = real_models_dir() / "minimax-m2" / "MiniMax-M2.jinja"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "tags": {"type": "array"}, "exact": {"type": "boolean"}}}}}
CALL = ('<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris'
        '</parameter>\n<parameter name="days">3</parameter>\n</invoke>\n'
        '<invoke name="get_weather">\n<parameter name="city">Rome</parameter>\n</invoke>\n'
        '</minimax:tool_call>')


def parser(tools=(WEATHER,)):
    return get_tool_parser("minimax_m2")(list(tools))


def test_calls_typed_by_schema_and_content_before():
    out = parser().parse("Let me check.\n" + CALL)
    assert out.content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "Rome"})]
    assert len({c.id for c in out.tool_calls}) == 2


def test_json_values_and_unknown_tools():
    text = ('<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="tags">'
            '["a", "b"]</parameter>\n<parameter name="exact">true</parameter>\n'
            '<parameter name="note">\n42\n</parameter>\n</invoke>\n</minimax:tool_call>')
    args = json.loads(parser().parse(text).tool_calls[0].arguments)
    assert args == {"tags": ["a", "b"], "exact": True, "note": "42"}
    bare = get_tool_parser("minimax_m2")().parse(CALL).tool_calls[0]
    assert json.loads(bare.arguments) == {"city": "Paris", "days": "3"}
    empty = parser().parse('<minimax:tool_call>\n<invoke name="noop">\n</invoke>\n'
                           '</minimax:tool_call>')
    assert [(c.name, c.arguments) for c in empty.tool_calls] == [("noop", "{}")]


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_streaming_equals_whole(seed):
    text = "Sure.\n" + CALL
    whole = parser().parse(text)
    rng = None if seed is None else random.Random(seed)
    content, calls = streamed(parser(), text, rng, pieces=True)
    assert content == whole.content
    assert [(n, a) for n, a, _ in calls] == [(c.name, c.arguments) for c in whole.tool_calls]
    if seed is None:
        assert all(pieces >= 2 for _, _, pieces in calls)


def test_not_a_call_and_cut_off_calls():
    junk = "<minimax:tool_call>\nnot xml\n</minimax:tool_call>"
    assert parser().parse(junk).content == junk and not parser().parse(junk).tool_calls
    cut = parser().parse('<minimax:tool_call>\n<invoke name="get_weather">\n'
                         '<parameter name="city">Par')
    assert [(c.name, c.arguments) for c in cut.tool_calls] == [("get_weather",
                                                                '{"city": "Par"}')]
    head_only = parser().parse("<minimax:tool_call>\n<invoke na")
    assert head_only.content == "<minimax:tool_call>\n<invoke na" and not head_only.tool_calls


def test_fuzz_streaming_equals_whole():
    rng = random.Random(11)
    parts = [CALL, "<minimax:tool_call>", "</minimax:tool_call>", '<invoke name="f">',
             "</invoke>", '<parameter name="a">', "</parameter>", "\n", " ", "x", "<", "é"]
    for _ in range(200):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(1, 8)))
        whole = parser().parse(text)
        expected = (whole.content, [(c.name, c.arguments) for c in whole.tool_calls])
        content, calls = streamed(parser(), text, random.Random(len(text)), pieces=True)
        assert (content, [(n, a) for n, a, _ in calls]) == expected, text


fixtures = pytest.mark.skipif(not TEMPLATE.is_file(), reason="real-model fixtures not present")


@fixtures
def test_template_markup_reads_back_as_the_same_calls():
    calls = [{"id": "a", "type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Zürich", "days": 2, "tags": ["x"]}}},
        {"id": "b", "type": "function", "function": {"name": "get_weather",
                                                     "arguments": {"city": "Rome"}}}]
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "Checking.", "tool_calls": calls}]
    text = render_chat_template(TEMPLATE.read_text(encoding="utf-8"), messages)
    reply = text.split("]~b]ai\n", 1)[1].removesuffix("[e~[\n")
    out = parser().parse(reply)
    assert out.content == "Checking."
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in calls]


@fixtures
def test_default_parser_for_the_real_template_and_model_type():
    assert default_tool_parser_for(None, TEMPLATE.read_text(encoding="utf-8")) == "minimax_m2"
    assert default_tool_parser_for("minimax_m2") == "minimax_m2"
