"""Chat templates get tool-call arguments of the kind they render, and ``--chat-template``
overrides the model's template (issue #30).

transformers hands ``arguments`` to a template as the client sent them; this file checks the
server against :func:`render_chat_template` (byte-identical to transformers, see
tests/test_chat_template.py) fed with the kind each template reads.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import httpx
import msgspec
import pytest

from atlas_core.server.anthropic_schemas import MessagesRequest
from atlas_core.server.errors import APIError
from atlas_core.server.openai_schemas import ChatCompletionRequest
from atlas_core.server.prompts import anthropic_messages, openai_messages, render_prompt
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.fixtures import real_models_dir
from atlas_core.tokenizer import ChatTemplateError, Tokenizer, render_chat_template
from atlas_core.tokenizer.chat_template import (adapt_tool_arguments, load_chat_template,
                                                tool_arguments_form)
from test_server_support import wait_until

FIXTURES = real_models_dir()
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason="real-model fixtures not present")
DEEPSEEK = "deepseek-v3/deepseek-ai-DeepSeek-V3.1.jinja"
DEEPSEEK_TOKENS = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ARGUMENTS = {"city": "Zürich", "days": [1, 2]}


def template(name: str) -> str:
    if name.endswith(".json"):
        return json.loads((FIXTURES / name).read_text(encoding="utf-8"))["chat_template"]
    return (FIXTURES / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name, form", [
    (DEEPSEEK, "string"),
    ("qwen3/tokenizer_config.json", "any"),
    ("qwen3.5/chat_template.jinja", "mapping"),
    ("qwen3-coder/Qwen3-Coder.jinja", "mapping"),
    ("llama-3/meta-llama-Llama-3.1-8B-Instruct.jinja", "mapping"),
    ("mistral/Mistral-Small-3.2-24B-Instruct-2506.jinja", "mapping"),
    ("gpt-oss/chat_template.jinja", "mapping"),
    ("minimax-m2/MiniMax-M2.jinja", "mapping"),
    ("gemma-4/chat_template.jinja", "any"),
    ("nemotron/NVIDIA-Nemotron-Nano-v2.jinja", "any"),
])
def test_tool_arguments_form_of_real_templates(name, form):
    assert tool_arguments_form(template(name)) == form


def test_tool_arguments_form_of_small_templates():
    assert tool_arguments_form("{{ m['arguments'] + 'x' }}") == "string"
    assert tool_arguments_form("{{ c.arguments }}") == "string"
    assert tool_arguments_form("{% for k, v in c.arguments.items() %}{% endfor %}") == "mapping"
    assert tool_arguments_form("{{ c.arguments | tojson }}{{ '' + c.arguments }}") == "any"
    assert tool_arguments_form("{{ messages }}") == "any"
    assert tool_arguments_form("{% if %}") == "any"


def test_adapt_tool_arguments():
    calls = [{"id": "a", "function": {"name": "f", "arguments": '{"q": "é"}'}},
             {"id": "b", "function": {"name": "f", "arguments": "{oops"}},
             {"id": "c", "name": "f", "arguments": {"q": 1}}]
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": calls}]
    mapped = adapt_tool_arguments(messages, "mapping")[1]["tool_calls"]
    assert [c.get("function", c)["arguments"] for c in mapped] == [{"q": "é"}, "{oops", {"q": 1}]
    text = adapt_tool_arguments(messages, "string")[1]["tool_calls"]
    assert [c.get("function", c)["arguments"] for c in text] == ['{"q": "é"}', "{oops", '{"q": 1}']
    assert adapt_tool_arguments(messages, "any") is messages
    assert messages[1]["tool_calls"][2]["arguments"] == {"q": 1}


@pytest.fixture(scope="module")
def qwen3_tokenizer():
    return Tokenizer.from_dir(FIXTURES / "qwen3")


def with_template(tokenizer: Tokenizer, source: str) -> Tokenizer:
    tokenizer.chat_templates = {"default": source}
    return tokenizer


def openai_turns(arguments: str) -> list[dict]:
    body = {"messages": [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]}
    return openai_messages(msgspec.convert(body, ChatCompletionRequest).messages)


def anthropic_turns() -> list[dict]:
    body = {"max_tokens": 5, "messages": [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": ARGUMENTS}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]}
    req = msgspec.convert(body, MessagesRequest)
    return anthropic_messages(req.system, req.messages)


def reference_render(source: str, arguments, tools=None, **kwargs) -> str:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}
    messages = [{"role": "user", "content": "Weather in Zürich?"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    return render_chat_template(source, messages, tools=tools, add_generation_prompt=True,
                                **kwargs)


def test_deepseek_v31_renders_openai_string_arguments(qwen3_tokenizer):
    source = template(DEEPSEEK)
    tok = with_template(qwen3_tokenizer, source)
    arguments = json.dumps(ARGUMENTS, ensure_ascii=False)
    text, ids = render_prompt(tok, openai_turns(arguments), template_kwargs=DEEPSEEK_TOKENS)
    assert text == reference_render(source, arguments, **DEEPSEEK_TOKENS)
    assert f"get_weather<｜tool▁sep｜>{arguments}<｜tool▁call▁end｜>" in text and ids
    with pytest.raises(ChatTemplateError):
        reference_render(source, ARGUMENTS, **DEEPSEEK_TOKENS)


def test_deepseek_v31_renders_anthropic_tool_use(qwen3_tokenizer):
    tok = with_template(qwen3_tokenizer, template(DEEPSEEK))
    text, _ = render_prompt(tok, anthropic_turns(), template_kwargs=DEEPSEEK_TOKENS)
    assert f"get_weather<｜tool▁sep｜>{json.dumps(ARGUMENTS, ensure_ascii=False)}<｜tool" in text


def test_qwen35_renders_openai_string_arguments(qwen3_tokenizer):
    source = template("qwen3.5/chat_template.jinja")
    tok = with_template(qwen3_tokenizer, source)
    arguments = json.dumps(ARGUMENTS)
    text, _ = render_prompt(tok, openai_turns(arguments), tools=[WEATHER])
    assert text == reference_render(source, ARGUMENTS, tools=[WEATHER])
    assert "<parameter=city>\nZürich\n</parameter>" in text
    assert render_prompt(tok, anthropic_turns(), tools=[WEATHER])[0] == text


def test_qwen3_renders_both_kinds(qwen3_tokenizer):
    source = template("qwen3/tokenizer_config.json")
    tok = with_template(qwen3_tokenizer, source)
    from_openai = render_prompt(tok, openai_turns(json.dumps(ARGUMENTS)), tools=[WEATHER])[0]
    assert from_openai == render_prompt(tok, anthropic_turns(), tools=[WEATHER])[0]
    assert '"arguments": {"city": "Zürich", "days": [1, 2]}' in from_openai


def test_a_template_that_fails_is_a_400(qwen3_tokenizer):
    tok = with_template(qwen3_tokenizer, "{{ raise_exception('no tools here') }}")
    with pytest.raises(APIError, match="no tools here") as info:
        render_prompt(tok, openai_turns("{}"))
    assert info.value.status == 400


def test_load_chat_template(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("FILE{{ messages[0]['content'] }}", encoding="utf-8")
    assert load_chat_template(str(path)) == "FILE{{ messages[0]['content'] }}"
    assert load_chat_template("{{ 'inline' }}") == "{{ 'inline' }}"
    with pytest.raises(ChatTemplateError, match="neither a file nor a Jinja template"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    with pytest.raises(ChatTemplateError, match="does not compile"):
        load_chat_template("{% if %}")


SERVE = [sys.executable, "-c", "import sys; from atlas_core.cli import main; sys.exit(main())",
         "serve"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-template")
    write_tiny_checkpoint("Qwen3ForCausalLM", path)
    return path


def test_bad_chat_template_flag_fails_before_serving(tiny_dir, tmp_path):
    proc = subprocess.run([*SERVE, str(tiny_dir), "--port", "0", "--chat-template",
                           str(tmp_path / "nope.jinja")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --chat-template") and "neither a file" in last


def test_chat_template_flag_overrides_the_model_template(tiny_dir, tmp_path):
    path = tmp_path / "override.jinja"
    path.write_text("OVERRIDE {{ messages[-1]['content'] }} END", encoding="utf-8")
    proc = subprocess.Popen([*SERVE, str(tiny_dir), "--backend", "numpy", "--port", "0",
                             "--num-kv-blocks", "32", "--served-model-name", "tiny",
                             "--max-seq-len", "128", "--chat-template", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"(http://\S+)/v1", proc.stdout.readline()).group(1)
        assert wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, timeout=60)
        body = {"model": "tiny", "max_tokens": 1000, "messages": [
            {"role": "system", "content": "ignored by the override"},
            {"role": "user", "content": "hello"}]}
        counted = httpx.post(f"{url}/v1/messages/count_tokens", json=body, timeout=30).json()
        tokenizer = Tokenizer.from_dir(tiny_dir)
        expected = tokenizer.encode("OVERRIDE hello END", add_special_tokens=False)
        assert counted["input_tokens"] == len(expected)
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
        assert reply["usage"]["prompt_tokens"] == len(expected)
        assert reply["usage"]["completion_tokens"] == 128 - len(expected)
        assert reply["choices"][0]["finish_reason"] == "length"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) in (0, 130)
        proc.stdout.close()
        proc.stderr.close()
