"""The real MiniMax-M2 chat template (../shared/fixtures/real-models/minimax-m2) renders
byte-identically to HF ``apply_chat_template`` through Atlas' tokenizer, on agentic
conversations: tools offered, parallel calls, multi-turn tool results (text and parts), and
reasoning kept in the history after the last user turn (interleaved thinking) but dropped
before it."""

from __future__ import annotations

import pytest

from atlas_core.api import Tokenizer
from minimax_checkpoints import TEMPLATE

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.reference,
              pytest.mark.skipif(not TEMPLATE.is_file(), reason="real-model fixtures not present")]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "days": {"type": "integer"}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Search the web.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}


def call(call_id: str, name: str, arguments) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


AGENT = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "Weather in Paris and Rome for 2 days?"},
    {"role": "assistant", "content": "Checking both.", "reasoning_content": "Two cities: call twice.",
     "tool_calls": [call("c1", "get_weather", {"city": "Paris", "days": 2}),
                    call("c2", "get_weather", {"city": "Rome", "days": 2})]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"sky": "sunny", "temp_c": 24}'},
    {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "rain, 17 C"}]},
    {"role": "assistant", "content": "<think>\nBoth answered.\n</think>\n\nParis: sunny; Rome: rain.",
     "tool_calls": [call("c3", "search", {"query": "umbrella ☂️ Rome"})]},
    {"role": "tool", "tool_call_id": "c3", "content": "Shops near Termini."},
]
CONVERSATIONS = {
    "agent_in_progress": (AGENT, [WEATHER, SEARCH]),
    "agent_next_user_turn": (AGENT + [
        {"role": "assistant", "content": "Take an umbrella.", "reasoning_content": "Summarise."},
        {"role": "user", "content": "And tomorrow, 你好?"}], [WEATHER, SEARCH]),
    "no_system_no_tools": ([{"role": "user", "content": "Hi"},
                            {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet."},
                            {"role": "user", "content": "Bye"}], None),
}


@pytest.fixture(scope="module")
def tokenizers(checkpoint):
    return transformers.AutoTokenizer.from_pretrained(str(checkpoint)), Tokenizer.from_dir(checkpoint)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_renders_like_transformers(tokenizers, name, generation_prompt):
    hf, ours = tokenizers
    messages, tools = CONVERSATIONS[name]
    expected = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt,
                                      tokenize=False)
    got = ours.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt)
    assert got == expected


def test_history_keeps_reasoning_only_after_the_last_user_turn(tokenizers):
    _, ours = tokenizers
    in_progress = ours.apply_chat_template(AGENT, tools=[WEATHER, SEARCH])
    assert "<think>\nTwo cities: call twice.\n</think>" in in_progress
    assert "<think>\nBoth answered.\n</think>" in in_progress
    assert in_progress.endswith("]~b]ai\n<think>\n")
    assert in_progress.count("]~b]tool") == 2 and "<response>Shops near Termini.</response>" in in_progress
    messages, tools = CONVERSATIONS["agent_next_user_turn"]
    later = ours.apply_chat_template(messages, tools=tools)
    assert "Two cities" not in later and "Both answered" not in later and "Summarise" not in later
    assert '<parameter name="days">2</parameter>' in later
