"""Chat templates of real models render byte-identically to HF transformers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import jinja2

from atlas_core.testing.fixtures import real_models_dir
from atlas_core.tokenizer import ChatTemplateError, Tokenizer, render_chat_template

FIXTURES = real_models_dir()
reference = [pytest.mark.reference,
             pytest.mark.skipif(not FIXTURES.is_dir(), reason="real-model fixtures not present")]

QWEN_TOKENS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
THINK = [{}, {"enable_thinking": True}, {"enable_thinking": False}]
# name: (fixture dir, standalone template file or None, special tokens when no config, kwargs variants)
TEMPLATES = {
    "qwen3": ("qwen3", None, None, THINK),
    "llama-3.2": ("llama-3", None, None, [{}, {"date_string": "26 Jul 2024"}]),
    "llama-3.1": ("llama-3", "meta-llama-Llama-3.1-8B-Instruct.jinja", None, [{}]),
    "qwen3-coder": ("qwen3-coder", "Qwen3-Coder.jinja", QWEN_TOKENS, [{}]),
    "qwen3.5": ("qwen3.5", "chat_template.jinja", None, THINK),
    "qwen3.5-4b": ("qwen3.5", "Qwen3.5-4B.jinja", None, THINK),
    "mistral": ("mistral", "Mistral-Small-3.2-24B-Instruct-2506.jinja",
                {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, [{}]),
    "gemma-3": ("gemma-3", None, None, [{}]),
    "gemma-4": ("gemma-4", "chat_template.jinja", None, THINK),
    "nemotron-3": ("nemotron", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", QWEN_TOKENS,
                   THINK + [{"truncate_history_thinking": False}]),
    "nemotron-v2": ("nemotron", "NVIDIA-Nemotron-Nano-v2.jinja", QWEN_TOKENS, THINK),
    "minimax-m2": ("minimax-m2", "MiniMax-M2.jinja", {"eos_token": "[e~["}, [{}]),
    "deepseek-v3": ("deepseek-v3", "deepseek-ai-DeepSeek-V3.1.jinja",
                    {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
                    [{}, {"thinking": True}, {"thinking": False}]),
    "gpt-oss": ("gpt-oss", "chat_template.jinja", None, [{}, {"reasoning_effort": "high"}]),
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
SEARCH = {"name": "search", "description": "Search the web.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}


def _tool_turns(arguments):
    call = {"id": "abcDEF123", "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}
    return [{"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "abcDEF123", "name": "get_weather",
             "content": '{"temp_c": 21, "sky": "☀️"}'}]


CONVERSATIONS = {
    "single": ([{"role": "user", "content": "Hello!"}], None),
    "multi": ([{"role": "system", "content": "You are terse."},
               {"role": "user", "content": "Hi, 你好 👋"},
               {"role": "assistant", "content": "Hello! Café?"},
               {"role": "user", "content": "Explain e\u0301 vs é."}], None),
    "tools_offered": ([{"role": "system", "content": "Use tools."},
                       {"role": "user", "content": "What's the weather in Paris?"}], [WEATHER, SEARCH]),
    "tool_calls_dict": (_tool_turns({"city": "Zürich", "unit": "celsius"}), [WEATHER]),
    "tool_calls_str": (_tool_turns('{"city": "Zürich"}'), [WEATHER]),
    "tool_calls_str_empty_content": ([{**m, "content": ""} if m["role"] == "assistant" else m
                                      for m in _tool_turns('{"city": "Zürich"}')], [WEATHER]),
    "tool_calls_empty_content": ([{**m, "content": ""} if m["role"] == "assistant" else m
                                  for m in _tool_turns({"city": "Zürich"})], [WEATHER]),
    "tools_wrapped": ([{"role": "user", "content": "Weather in Paris?"}], [WEATHER]),
    "reasoning": ([{"role": "user", "content": "2+2?"},
                   {"role": "assistant", "content": "4", "reasoning_content": "Add two and two."},
                   {"role": "user", "content": "And 3+3?"}], None),
}


@pytest.fixture(scope="module")
def small_qwen3_json(tmp_path_factory) -> Path:
    """qwen3's tokenizer.json cut to its first 2000 tokens: loads in milliseconds, same added tokens."""
    data = json.loads((FIXTURES / "qwen3" / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = {k: v for k, v in data["model"]["vocab"].items() if v < 2000}
    data["model"]["vocab"] = vocab
    data["model"]["merges"] = [m for m in data["model"]["merges"]
                               if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    path = tmp_path_factory.mktemp("small") / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _synthesize(name: str, tmp: Path, small_json: Path) -> Path:
    """A model directory for fixture ``name``: its config and template around a qwen3 tokenizer."""
    folder, template_file, tokens, _ = TEMPLATES[name]
    src = FIXTURES / folder
    config = json.loads((src / "tokenizer_config.json").read_text()) if tokens is None else dict(tokens)
    config.pop("added_tokens_decoder", None)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    out = tmp / name
    out.mkdir()
    os.symlink(small_json, out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    if template_file is not None:
        (out / "chat_template.jinja").write_text((src / template_file).read_text(encoding="utf-8"),
                                                 encoding="utf-8")
    return out


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def pair(request, tmp_path_factory, small_qwen3_json):
    transformers = pytest.importorskip("transformers")
    path = _synthesize(request.param, tmp_path_factory.mktemp("tpl"), small_qwen3_json)
    hf = transformers.AutoTokenizer.from_pretrained(str(path))
    return request.param, hf, Tokenizer.from_dir(path)


def _render_both(hf, ours, messages, tools, agp, kwargs):
    try:
        expected = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=agp,
                                          tokenize=False, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any HF failure must be mirrored as ours
        with pytest.raises(ChatTemplateError):
            ours.apply_chat_template(messages, tools=tools, add_generation_prompt=agp, **kwargs)
        return type(exc)
    got = ours.apply_chat_template(messages, tools=tools, add_generation_prompt=agp, **kwargs)
    assert got == expected
    return None


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@reference[0]
@reference[1]
def test_matches_transformers(pair, conversation):
    name, hf, ours = pair
    messages, tools = CONVERSATIONS[conversation]
    assert ours.special_tokens == hf.special_tokens_map
    for kwargs in TEMPLATES[name][3]:
        for agp in (True, False):
            _render_both(hf, ours, messages, tools, agp, kwargs)


@reference[0]
@reference[1]
def test_simple_chat_renders_everywhere(pair):
    name, hf, ours = pair
    messages, _ = CONVERSATIONS["single"]
    assert _render_both(hf, ours, messages, None, True, {}) is None, name


def _render(source, messages=({"role": "user", "content": "hi"},), **kwargs):
    return render_chat_template(source, list(messages), **kwargs)


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__base__ }}",
    "{{ raise_exception.__globals__ }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{% set ns = namespace(_private=1) %}",
    "{% set ns = namespace() %}{% set ns._x = 1 %}",
    "{{ messages.append(1) }}",
    "{{ messages[0].update({'role': 'x'}) }}",
    "{% include 'secret.txt' %}",
    "{% import 'os' as os %}",
    "{{ dict.__call__.__globals__ }}",
])
def test_sandbox_blocks_escapes(source):
    try:
        out = _render(source)
    except ChatTemplateError:
        return
    assert out == "", "an unsafe attribute must read as undefined"


@pytest.mark.parametrize("source", ["{{ ''.__class__.__mro__[1].__subclasses__() }}",
                                    "{{ messages.append(1) }}", "{% include 'secret.txt' %}",
                                    "{% set ns = namespace(_private=1) %}"])
def test_sandbox_escapes_raise(source):
    with pytest.raises(ChatTemplateError):
        _render(source)


def test_unsafe_attribute_renders_nothing():
    assert _render("[{{ ''.__class__ }}{{ raise_exception.__globals__ }}]") == "[]"


def test_raise_exception_is_a_template_error():
    with pytest.raises(ChatTemplateError, match="roles must alternate") as info:
        _render("{{ raise_exception('roles must alternate') }}")
    assert isinstance(info.value, jinja2.TemplateError) and isinstance(info.value, ValueError)


def test_tojson_semantics():
    data = {"b": "é<&>", "a": [1, 2]}
    assert _render("{{ x | tojson }}", x=data) == '{"b": "é<&>", "a": [1, 2]}'
    assert _render("{{ x | tojson(indent=2) }}", x={"a": 1}) == '{\n  "a": 1\n}'
    assert _render("{{ x | tojson(sort_keys=true) }}", x=data) == '{"a": [1, 2], "b": "é<&>"}'
    assert _render("{{ x | tojson(ensure_ascii=true) }}", x="é") == '"\\u00e9"'
    assert _render("{{ x | tojson(separators=(',', ':')) }}", x={"a": [1, 2]}) == '{"a":[1,2]}'


def test_globals_and_whitespace_control():
    assert _render("{{ strftime_now('%Y') | length }}") == "4"
    assert _render("{{ dict(a=1) | tojson }}") == '{"a": 1}'
    assert _render("{% for m in messages %}\n  {% if loop.first %}{% continue %}{% endif %}x\n{% endfor %}") == ""
    assert _render("{% if true %}\n  a\n{% endif %}\nb") == "  a\nb"


def test_inputs_prepared_like_transformers():
    messages = [{"role": "assistant", "content": None, "reasoning": "why", "tool_calls": None}]
    out = _render("{{ messages[0] | tojson }}", messages=messages)
    assert json.loads(out) == {"thinking": "why", "role": "assistant", "reasoning": "why",
                               "reasoning_content": "why"}
    with pytest.raises(ChatTemplateError, match="empty conversation"):
        _render("x", messages=[])
    with pytest.raises(ChatTemplateError, match="tools must be JSON-schema objects"):
        _render("x", tools=[print])
