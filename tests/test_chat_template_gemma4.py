"""The Gemma-4 chat template renders byte-identically to HF transformers on agent conversations:
tools offered, two rounds of calls with their results, parallel calls, thinking on and off."""

from __future__ import annotations

import json
import shutil

import pytest

from atlas_core.testing.fixtures import real_models_dir
from atlas_core.testing.tiny_tokenizer import write_tokenizer
from atlas_core.tokenizer import Tokenizer

GEMMA4 = real_models_dir() / "gemma-4"
pytestmark = [pytest.mark.reference,
              pytest.mark.skipif(not GEMMA4.is_dir(), reason="real-model fixtures not present")]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time.",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}


def _call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


AGENT = [
    {"role": "system", "content": "You are a travel agent."},
    {"role": "user", "content": "Weather in Zürich and Rome, and the time in Rome?"},
    {"role": "assistant", "content": "", "reasoning_content": "Two cities first.",
     "tool_calls": [_call("c1", "get_weather", {"city": "Zürich", "days": 2}),
                    _call("c2", "get_weather", {"city": "Rome", "unit": "celsius"})]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"temp_c": 11, "sky": "rain"}'},
    {"role": "tool", "tool_call_id": "c2", "content": '{"temp_c": 24, "sky": "sun"}'},
    {"role": "assistant", "content": None,
     "tool_calls": [_call("c3", "get_time", {"tz": "Europe/Rome"})]},
    {"role": "tool", "tool_call_id": "c3", "content": "14:05"},
    {"role": "assistant", "content": "Rainy 11°C in Zürich; sunny 24°C in Rome at 14:05."},
    {"role": "user", "content": "Thanks!"},
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("gemma4-template")
    write_tokenizer(path, 384)
    config = json.loads((GEMMA4 / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    shutil.copy(GEMMA4 / "chat_template.jinja", path / "chat_template.jinja")
    return transformers.AutoTokenizer.from_pretrained(str(path)), Tokenizer.from_dir(path)


@pytest.mark.parametrize("turns", [3, 5, 7, 8, 9])
@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": True}])
def test_agent_conversation_matches_transformers(pair, turns, kwargs):
    hf, ours = pair
    messages = AGENT[:turns]
    for agp in (True, False):
        expected = hf.apply_chat_template(messages, tools=[WEATHER, TIME], tokenize=False,
                                          add_generation_prompt=agp, **kwargs)
        got = ours.apply_chat_template(messages, tools=[WEATHER, TIME],
                                       add_generation_prompt=agp, **kwargs)
        assert got == expected
    assert "<|tool_response>" in got or turns < 4
