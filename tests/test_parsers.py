"""Tool-call and reasoning parsers: realistic outputs, malformed / truncated calls, and streamed
parsing under random chunkings equal to whole-text parsing."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from atlas_core.testing.fixtures import real_models_dir
from atlas_core.parsers import (
    OutputParser,
    ParsedOutput,
    ReasoningParser,
    ToolCall,
    default_reasoning_parser_for,
    default_tool_parser_for,
    get_reasoning_parser,
    get_tool_parser,
    prompt_opens_reasoning,
)

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "threshold": {"type": "number"}, "tags": {"type": "array"}, "opts": {"type": "object"},
        "note": {"type": ["string", "null"]}, "zip": {"type": "string"}}}}}
MARKUP = ("<tool_call", "</tool_call", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "<function=",
          "<parameter=", "<think>", "</think>")


def _stream(parser, text: str, rng: random.Random | None) -> ParsedOutput:
    out, calls = ParsedOutput(), {}
    pos = 0
    events = []
    while pos < len(text):
        size = 1 if rng is None else rng.randint(1, 12)
        events.append(parser.feed(text[pos:pos + size]))
        pos += size
    events.append(parser.finish())
    reasoning = []
    for event in events:
        out.content += event.content
        reasoning.append(event.reasoning)
        for delta in event.tool_calls:
            if delta.name is not None:
                assert delta.index == len(calls)
                calls[delta.index] = ToolCall(delta.id, delta.name, "")
            calls[delta.index].arguments += delta.arguments
    out.tool_calls = list(calls.values())
    out.reasoning = "".join(reasoning)
    return out


def _arguments(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _calls(out: ParsedOutput) -> list[tuple[str, object]]:
    """``(name, arguments)`` per call: decoded JSON, or the raw text of a cut-off call."""
    return [(c.name, _arguments(c.arguments)) for c in out.tool_calls]


def check(make, text: str, content: str, calls: list, reasoning: str | None = ...) -> ParsedOutput:
    """``make()`` parses ``text`` to ``content`` / ``calls``, streamed in any chunking alike."""
    whole = make().parse(text)
    assert whole.content == content
    assert _calls(whole) == calls
    if reasoning is not ...:
        assert whole.reasoning == reasoning
    if calls:
        assert not any(m in whole.content for m in MARKUP if m not in content)
    for seed in [None, *range(25)]:
        streamed = _stream(make(), text, None if seed is None else random.Random(seed))
        assert streamed.content == whole.content, seed
        assert _calls(streamed) == calls, seed
        assert [c.arguments for c in streamed.tool_calls] == [c.arguments for c in whole.tool_calls]
        assert streamed.reasoning == (whole.reasoning or ""), seed
    return whole


def hermes():
    return get_tool_parser("hermes")([WEATHER])


HERMES_CASES = [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>',
     "", [("get_weather", {"city": "Paris", "days": 2})]),
    ('Let me check both cities.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京"}}\n'
     '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich 🌧"}}\n</tool_call>',
     "Let me check both cities.", [("get_weather", {"city": "東京"}), ("get_weather", {"city": "Zürich 🌧"})]),
    ("The answer is 4. Use <b>bold</b> and a < b.", "The answer is 4. Use <b>bold</b> and a < b.", []),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Par', "", [("get_weather", '{"city": "Par')]),
    ('<tool_call>{"name": "get_weather", "argu', '<tool_call>{"name": "get_weather", "argu', []),
    ('Sure <tool_call>{"name": get_weather}</tool_call> done', 'Sure <tool_call>{"name": get_weather}</tool_call> done', []),
    ('<tool_call>{"arguments": {}}</tool_call>\n<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>\nOK',
     '<tool_call>{"arguments": {}}</tool_call>OK', [("f", {"x": 1})]),
    ("Trailing partial marker <tool_", "Trailing partial marker <tool_", []),
    ('<tool_call>{"name": "noargs"}</tool_call>', "", [("noargs", {})]),
]


@pytest.mark.parametrize("text,content,calls", HERMES_CASES)
def test_hermes(text, content, calls):
    check(hermes, text, content, calls)


def test_hermes_content_after_call_is_kept():
    out = check(hermes, '<tool_call>{"name": "f", "arguments": {}}</tool_call>\n\nDone.', "Done.", [("f", {})])
    assert out.tool_calls[0].id.startswith("call_")


def coder():
    return get_tool_parser("qwen3_coder")([WEATHER])


CODER_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
              "<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
              "<parameter=threshold>\n-2.5\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n"
              "<parameter=opts>\n{\"x\": {\"y\": 1}}\n</parameter>\n<parameter=note>\nnull\n</parameter>\n"
              "<parameter=zip>\n01234\n</parameter>\n<parameter=extra>\nline one\nline two\n</parameter>\n"
              "</function>\n</tool_call>")
CODER_ARGS = {"city": "New York", "days": 3, "metric": True, "threshold": -2.5, "tags": ["a", "b"],
              "opts": {"x": {"y": 1}}, "note": None, "zip": "01234", "extra": "line one\nline two"}


def test_qwen3_coder_types_from_schema():
    check(coder, "I'll look that up.\n" + CODER_CALL, "I'll look that up.", [("get_weather", CODER_ARGS)])


def test_qwen3_coder_without_schema_keeps_strings():
    out = get_tool_parser("qwen3_coder")().parse(CODER_CALL)
    assert json.loads(out.tool_calls[0].arguments)["days"] == "3"


@pytest.mark.parametrize("text,content,calls", [
    (CODER_CALL + "\n" + CODER_CALL.replace("New York", "Oslo"), "",
     [("get_weather", CODER_ARGS), ("get_weather", {**CODER_ARGS, "city": "Oslo"})]),
    ("<tool_call>\n<function=get_weather>\n<parameter=days>\nabc\n</parameter>\n</function>\n</tool_call>",
     "", [("get_weather", {"days": "abc"})]),
    ("<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\n2\n</function>\n</tool_call>",
     "", [("f", {"a": "1", "b": "2"})]),
    (CODER_CALL[:80], "", [("get_weather", {"city": "New York"})]),
    (CODER_CALL[:-12], "", [("get_weather", CODER_ARGS)]),
    (CODER_CALL[:30], CODER_CALL[:30], []),
    ("<tool_call>\nnot xml at all\n</tool_call> tail", "<tool_call>\nnot xml at all\n</tool_call> tail", []),
])
def test_qwen3_coder_cases(text, content, calls):
    check(coder, text, content, calls)


def mistral():
    return get_tool_parser("mistral")()


@pytest.mark.parametrize("text,content,calls", [
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lyon"}}, {"name": "f", "arguments": {}}]',
     "", [("get_weather", {"city": "Lyon"}), ("f", {})]),
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon", "days": [1, 2]}', "", [("get_weather", {"city": "Lyon", "days": [1, 2]})]),
    ('Checking.[TOOL_CALLS]a[ARGS]{"x": "}"}[TOOL_CALLS]b[ARGS]{}', "Checking.", [("a", {"x": "}"}), ("b", {})]),
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Ly', "", [("get_weather", '{"city": "Ly')]),
    ('[TOOL_CALLS][{"name": "x"', '[TOOL_CALLS][{"name": "x"', []),
    ("[TOOL_CALLS]bad name here[ARGS]{}", "[TOOL_CALLS]bad name here[ARGS]{}", []),
    ('[TOOL_CALLS][{"foo": 1}] then text', '[TOOL_CALLS][{"foo": 1}] then text', []),
    ("Plain [answer] with [brackets].", "Plain [answer] with [brackets].", []),
])
def test_mistral(text, content, calls):
    check(mistral, text, content, calls)


def test_mistral_ids():
    out = mistral().parse('[TOOL_CALLS]f[CALL_ID]abc123XYZ[ARGS]{}[TOOL_CALLS][{"name": "g", "arguments": {}}]')
    assert out.tool_calls[0].id == "abc123XYZ"
    assert len(out.tool_calls[1].id) == 9 and out.tool_calls[1].id.isalnum()


def llama():
    return get_tool_parser("llama3_json")()


@pytest.mark.parametrize("text,content,calls", [
    ('{"name": "get_weather", "parameters": {"city": "Rome"}}', "", [("get_weather", {"city": "Rome"})]),
    ('  <|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"q": "ü"}}', "",
     [("a", {}), ("b", {"q": "ü"})]),
    ('Calling it now <|python_tag|>{"name": "a", "parameters": {"n": 1}}', "Calling it now", [("a", {"n": 1})]),
    ('{"answer": 42}', '{"answer": 42}', []),
    ('{"name": "get_weather", "parameters": {"ci', "", [("get_weather", '{"ci')]),
    ('{"name": "get_weather", "param', '{"name": "get_weather", "param', []),
    ('The JSON {"name": "x", "parameters": {}} is an example.', 'The JSON {"name": "x", "parameters": {}} is an example.', []),
    ('<|python_tag|>brave_search.call(query="x")', '<|python_tag|>brave_search.call(query="x")', []),
])
def test_llama3_json(text, content, calls):
    check(llama, text, content, calls)


@pytest.mark.parametrize("in_reasoning,text,reasoning,content", [
    (False, "<think>\nLet me think: 2+2=4.\n</think>\n\nThe answer is 4.", "Let me think: 2+2=4.", "The answer is 4."),
    (False, "<think>\n\n</think>\n\nHi!", "", "Hi!"),
    (False, "No reasoning here, a < b.", None, "No reasoning here, a < b."),
    (False, "<think>\nStill thinking when cut", "Still thinking when cut", ""),
    (False, "<thi", None, "<thi"),
    (True, "Okay, the user wants X.\n</think>\n\nHere is X.", "Okay, the user wants X.", "Here is X."),
    (True, "cut short mid-thought </thi", "cut short mid-thought </thi", ""),
    (True, "</think>Answer only.", "", "Answer only."),
])
def test_reasoning(in_reasoning, text, reasoning, content):
    check(lambda: ReasoningParser(in_reasoning=in_reasoning), text, content, [], reasoning)


def test_reasoning_then_tool_calls():
    text = ('<think>\nI should call <tool_call> maybe.\n</think>\n\nChecking.\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')

    def make():
        return OutputParser(ReasoningParser(), hermes())
    out = check(make, text, "Checking.", [("get_weather", {"city": "Paris"})], "I should call <tool_call> maybe.")
    assert out.reasoning == "I should call <tool_call> maybe."


def test_prompt_opens_reasoning():
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")


def test_registry_and_defaults():
    with pytest.raises(ValueError, match="unknown tool-call parser 'nope'.*hermes"):
        get_tool_parser("nope")
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        get_reasoning_parser("nope")
    assert get_reasoning_parser("think") is ReasoningParser
    assert default_tool_parser_for("qwen3_5") == "qwen3_coder"
    assert default_tool_parser_for("llama", None) == "llama3_json"
    assert default_tool_parser_for(None, "{{ '<tool_call>' }}") == "hermes"
    assert default_tool_parser_for("gemma3", "plain") is None
    assert default_reasoning_parser_for("{{ '</think>' }}") == "think"
    assert default_reasoning_parser_for("x") is None


FIXTURE_TEMPLATES = {"qwen3": "hermes", "qwen3-coder/Qwen3-Coder.jinja": "qwen3_coder",
                     "qwen3.5/chat_template.jinja": "qwen3_coder", "mistral": "mistral",
                     "llama-3/meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3_json", "llama-3": "llama3_json",
                     "nemotron/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": "qwen3_coder",
                     "gemma-4/chat_template.jinja": "gemma4", "gpt-oss/chat_template.jinja": None}


@pytest.mark.parametrize("where,expected", FIXTURE_TEMPLATES.items())
def test_default_parser_for_real_templates(where, expected):
    root = real_models_dir()
    path = root / where
    if not root.is_dir():
        pytest.skip("no fixtures")
    if path.is_dir():
        jinja = sorted(path.glob("*.jinja"))
        text = jinja[0].read_text() if jinja else json.loads((path / "tokenizer_config.json").read_text())["chat_template"]
    else:
        text = path.read_text()
    assert default_tool_parser_for(None, text) == expected


FRAGMENTS = {
    "hermes": ['<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>', "<tool_call>", "</tool_call>",
               '{"name": "g"}', "<tool", "\n", " ", "text", "<", "é🎉"],
    "qwen3_coder": ["<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
                    "<tool_call>", "</tool_call>", "<function=g>", "</function>", "\n", " ", "text", "<"],
    "mistral": ['[TOOL_CALLS]f[ARGS]{"a": [1]}', '[TOOL_CALLS][{"name": "g", "arguments": {}}]', "[TOOL_CALLS]",
                "[ARGS]", "{", "}", "[", "\n", " ", "text"],
    "llama3_json": ['{"name": "f", "parameters": {}}', "<|python_tag|>", ";", "{", "}", "\n", " ", "text", '"'],
}


@pytest.mark.parametrize("name", sorted(FRAGMENTS))
def test_fuzz_streaming_equals_whole(name):
    rng = random.Random(name)
    for _ in range(150):
        text = "".join(rng.choice(FRAGMENTS[name]) for _ in range(rng.randint(1, 8)))
        whole = get_tool_parser(name)().parse(text)
        for seed in range(3):
            streamed = _stream(get_tool_parser(name)(), text, random.Random(seed))
            assert (streamed.content, _calls(streamed)) == (whole.content, _calls(whole)), text


def test_fuzz_reasoning():
    rng = random.Random(7)
    parts = ["<think>", "</think>", "<thi", "</thi", "\n", " ", "a", "b c", "<tool_call>"]
    for _ in range(300):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 8)))
        for in_reasoning in (False, True):
            whole = ReasoningParser(in_reasoning=in_reasoning).parse(text)
            streamed = _stream(ReasoningParser(in_reasoning=in_reasoning), text, random.Random(1))
            assert (streamed.content, streamed.reasoning) == (whole.content, whole.reasoning or ""), text
