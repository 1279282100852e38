"""DeepSeek-V3 / V3.1 tool calls (``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>...``): the V3.1
form the real chat template renders reads back as the same calls, the V3 / R1 fenced form
parses, whole and streamed parsing agree under any chunking, markup never leaks into content,
and the format (and ``<think>`` reasoning) is picked by default for that template."""

from __future__ import annotations

import json
import random

import pytest

from atlas_core.parsers import (ReasoningParser, default_reasoning_parser_for,
                                default_tool_parser_for, get_tool_parser, prompt_opens_reasoning)
from atlas_core.testing.fixtures import real_models_dir
from atlas_core.tokenizer import render_chat_template

from test_parser_support import streamed

TEMPLATE = real_models_dir() / "deepseek-v3" / "deepseek-ai-DeepSeek-V3.1.jinja"
B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
V31 = (f'{B}{CB}get_weather{SEP}{{"city": "Paris", "days": 3}}{CE}'
       f'{CB}get_time{SEP}{{"tz": "CET"}}{CE}{E}')
V3 = (f'{B}{CB}function{SEP}get_weather\n```json\n{{"city": "Rome"}}\n```{CE}\n'
      f'{CB}function{SEP}get_time\n```json\n{{}}\n```{CE}{E}')


def parser():
    return get_tool_parser("deepseek_v3")()


def test_v31_calls_and_content_before():
    out = parser().parse("Checking." + V31)
    assert out.content == "Checking."
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "CET"})]
    assert len({c.id for c in out.tool_calls}) == 2


def test_v3_fenced_calls():
    out = parser().parse(V3)
    assert out.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("get_weather", {"city": "Rome"}), ("get_time", {})]


@pytest.mark.parametrize("text", [V31, V3, "Sure: " + V31 + " done"])
def test_every_chunking_streams_like_the_whole(text):
    whole = parser().parse(text)
    expected = (whole.content, [(c.name, c.arguments) for c in whole.tool_calls])
    assert streamed(parser(), text, None) == expected
    rng = random.Random(7)
    for _ in range(20):
        assert streamed(parser(), text, rng) == expected
    assert "｜" not in expected[0]


def test_not_a_call_is_content_and_cut_calls_end():
    assert parser().parse(f"{CB}no separator here").content == f"{CB}no separator here"
    cut = parser().parse(f'{B}{CB}get_weather{SEP}{{"city": "Pa')
    assert [(c.name, c.arguments) for c in cut.tool_calls] == [("get_weather", '{"city": "Pa')]


def test_template_round_trip_and_defaults():
    template = TEMPLATE.read_text(encoding="utf-8")
    calls = [{"type": "function", "function": {"name": "get_weather",
                                               "arguments": '{"city": "Paris"}'}}]
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": calls}]
    text = render_chat_template(template, messages, add_generation_prompt=False,
                                bos_token="<｜begin▁of▁sentence｜>",
                                eos_token="<｜end▁of▁sentence｜>")
    reply = text.split("<｜Assistant｜></think>", 1)[1].replace("<｜end▁of▁sentence｜>", "")
    out = parser().parse(reply)
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    assert default_tool_parser_for("deepseek_v3", template) == "deepseek_v3"
    assert default_tool_parser_for("deepseek_v3") == "deepseek_v3"
    assert default_reasoning_parser_for(template) == "think"


@pytest.mark.parametrize("thinking", [False, True])
def test_v31_generation_prompt_opens_reasoning_only_when_thinking(thinking):
    template = TEMPLATE.read_text(encoding="utf-8")
    prompt = render_chat_template(template, [{"role": "user", "content": "Hi"}],
                                  add_generation_prompt=True, thinking=thinking,
                                  bos_token="<｜begin▁of▁sentence｜>")
    assert prompt_opens_reasoning(prompt) is thinking
    parser = ReasoningParser(in_reasoning=prompt_opens_reasoning(prompt))
    out = parser.parse("plan</think>answer" if thinking else "answer")
    assert (out.reasoning, out.content) == (("plan" if thinking else None), "answer")
