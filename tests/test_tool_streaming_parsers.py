"""Incremental tool-call arguments from the parsers: a call starts once its name is known, its
arguments arrive in pieces that concatenate to the final ``arguments`` under any chunking, and
cut-off or malformed calls after the start end with what was generated."""

from __future__ import annotations

import json
import random

import pytest

from atlas_core.parsers import OutputParser, ReasoningParser, get_tool_parser
from atlas_core.parsers.json_prefix import JsonPrefix

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}
MARKUP = ("<tool_call", "</tool_call", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "<function=",
          "<parameter=", "</parameter", "</function")


def make(name: str):
    return get_tool_parser(name)([WEATHER])


def stream(parser, text: str, sizes=None):
    """Feed ``text`` in chunks (``sizes``: a Random for 1-12, None for 1); check the delta
    protocol; return ``(content, {index: [name, id, [argument pieces]]})``."""
    content, calls, done = "", {}, set()
    pos = 0
    events = []
    while pos < len(text):
        size = 1 if sizes is None else sizes.randint(1, 12)
        events.append(parser.feed(text[pos:pos + size]))
        pos += size
    events.append(parser.finish())
    for event in events:
        content += event.content
        for d in event.tool_calls:
            assert d.index not in done, "delta after the call ended"
            if d.name is not None:
                assert d.index == len(calls) and d.id
                calls[d.index] = [d.name, d.id, []]
            if d.arguments:
                calls[d.index][2].append(d.arguments)
            if d.done:
                done.add(d.index)
    assert done == set(calls), "every started call ends"
    return content, calls


def check_stream(name: str, text: str, content: str, arguments: list[str], min_pieces: int = 2):
    """Whole parse and every chunking agree exactly; char-by-char streaming gives at least
    ``min_pieces`` argument pieces for each call."""
    whole = make(name).parse(text)
    assert whole.content == content
    assert [c.arguments for c in whole.tool_calls] == arguments
    got, calls = stream(make(name), text)
    assert got == content
    assert ["".join(c[2]) for c in calls.values()] == arguments
    assert all(len(c[2]) >= min_pieces for c in calls.values()), calls
    for seed in range(20):
        got, calls = stream(make(name), text, random.Random(seed))
        assert (got, ["".join(c[2]) for c in calls.values()]) == (content, arguments), seed
    return calls


HERMES = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'


def test_hermes_streams_raw_arguments():
    calls = check_stream("hermes", "Checking.\n" + HERMES, "Checking.", ['{"city": "Paris", "days": 2}'])
    assert calls[0][0] == "get_weather" and calls[0][1].startswith("call_")


def test_hermes_tolerates_whitespace_and_pretty_printing():
    text = ('<tool_call>\n{ "name" : "get_weather" ,\n  "arguments" : {\n    "city": "Oslo"\n  }\n}\n'
            '</tool_call>\n\nDone.')
    check_stream("hermes", text, "Done.", ['{\n    "city": "Oslo"\n  }'])


def test_pieces_arrive_before_the_call_closes():
    parser = make("hermes")
    events = parser.feed('Hi <tool_call>{"name": "get_weather", "arguments": {"city": "Pa')
    assert events.content == "Hi"
    start, piece = events.tool_calls
    assert (start.name, start.arguments, start.done) == ("get_weather", "", False)
    assert piece.arguments == '{"city": "Pa' and not piece.done
    events = parser.feed('ris"}}</tool_call>')
    assert "".join(d.arguments for d in events.tool_calls) == 'ris"}' and events.tool_calls[-1].done


def test_partial_close_tag_is_held_back():
    parser = make("hermes")
    first = parser.feed('<tool_call>{"name": "f", "arguments": {"a": "x</tool_')
    assert "".join(d.arguments for d in first.tool_calls) == '{"a": "x'
    rest = parser.feed("call> after")
    tail = parser.finish()
    assert [d.done for d in rest.tool_calls] == [True] and rest.content + tail.content == "after"


@pytest.mark.parametrize("text,content,arguments", [
    ('<tool_call>{"name": "get_weather", "arguments": {"city": Paris}}</tool_call>', "", ['{"city": Paris}']),
    ('<tool_call>{"name": "f", "arguments": {"a": "x</tool_call>rest', "rest", ['{"a": "x']),
    ('<tool_call>{"name": "f", "arguments": {"a": 1}, junk}\n</tool_call>', "", ['{"a": 1}']),
    ('<tool_call>{"name": "f", "arguments": {"a": [1, 2', "", ['{"a": [1, 2']),
])
def test_hermes_started_calls_end_with_what_was_written(text, content, arguments):
    check_stream("hermes", text, content, arguments, min_pieces=1)


@pytest.mark.parametrize("text,arguments", [
    ('<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>', '{"a": 1}'),
    ('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', '{"a": 1}'),
    ('<tool_call>{"name": "f"}</tool_call>', "{}"),
])
def test_hermes_calls_that_cannot_stream_come_whole(text, arguments):
    calls = check_stream("hermes", text, "", [arguments], min_pieces=1)
    assert len(calls[0][2]) == 1


def test_qwen3_coder_streams_one_member_per_parameter():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
    calls = check_stream("qwen3_coder", text, "", ['{"city": "Paris", "days": 3}'])
    assert calls[0][2] == ['{"city": "Paris"', ', "days": 3', "}"]


def test_qwen3_coder_cut_off_and_empty_calls_are_valid_json():
    cut = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=da"
    check_stream("qwen3_coder", cut, "", ['{"city": "Paris"}'])
    check_stream("qwen3_coder", "<tool_call><function=f></function></tool_call>", "", ["{}"], 1)
    two = ("<tool_call><function=f><parameter=a>1</parameter></function>\n"
           "<function=g><parameter=b>2</parameter></function></tool_call>")
    check_stream("qwen3_coder", two, "", ['{"a": "1"}', '{"b": "2"}'])


def test_mistral_forms():
    text = '[TOOL_CALLS]get_weather[CALL_ID]abc123XYZ[ARGS]{"city": "Lyon"}'
    calls = check_stream("mistral", text, "", ['{"city": "Lyon"}'])
    assert calls[0][1] == "abc123XYZ"
    listed = '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": [2]}}]'
    check_stream("mistral", listed, "", ['{"x": 1}', '{"y": [2]}'])


def test_llama3_json_forms():
    check_stream("llama3_json", '{"name": "get_weather", "parameters": {"city": "Rome"}}', "",
                 ['{"city": "Rome"}'])
    text = '<|python_tag|>{"name": "a", "parameters": {"n": 1}}; {"name": "b", "parameters": {"m": 2}}'
    check_stream("llama3_json", text, "", ['{"n": 1}', '{"m": 2}'])


CALLS = {
    "hermes": HERMES,
    "qwen3_coder": ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"),
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lyon", "days": 1}}]',
    "llama3_json": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}',
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_cut_streams_like_the_whole_and_leaks_no_markup(name):
    text = "Sure. " + CALLS[name] + " Bye."
    for cut in range(len(text) + 1):
        whole = make(name).parse(text[:cut])
        content, calls = stream(make(name), text[:cut], random.Random(cut))
        assert content == whole.content, cut
        assert ["".join(c[2]) for c in calls.values()] == [c.arguments for c in whole.tool_calls]
        if calls:
            assert not any(m in content for m in MARKUP), (cut, content)


def test_output_parser_passes_pieces_through_after_reasoning():
    text = "<think>\nhmm <tool_call> no\n</think>\n\n" + HERMES
    parser = OutputParser(ReasoningParser(), make("hermes"))
    content, calls = stream(parser, text)
    assert content == "" and ["".join(c[2]) for c in calls.values()] == ['{"city": "Paris", "days": 2}']
    assert len(calls[0][2]) > 2


def test_json_prefix():
    text = '{"a": [1, -2.5e3, true, null], "b": {"c": "\\u00e9\\n"}}'
    checker = JsonPrefix()
    assert sum(checker.feed(ch) for ch in text) == len(text) and checker.is_complete
    for bad, valid in [('{"city": Paris}', 9), ('{"a": 01}', 7), ('{"a": 1,}', 8), ('{"a" 1}', 5)]:
        checker = JsonPrefix()
        assert checker.feed(bad) == valid and not checker.is_valid
        assert checker.feed("}") == 0
    assert json.loads(text)
