"""`atlas serve` with no model, driven by the official SDKs: the demo model really answers.

This is the README's first command as a user meets it: a real `atlas serve` process on the
built-in atlas-demo model, then questions with checkable answers and full tool-call round trips
through the OpenAI and Anthropic clients.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import httpx
import pytest

from test_demo_model import TOOLS
from test_server_support import wait_until

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

WEATHER = {"city": "Lisbon", "temperature": 21, "unit": "celsius", "condition": "sunny"}
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]


@pytest.fixture(scope="module")
def server_url():
    pytest.importorskip("atlas_qwen3", reason="the atlas-qwen3 plugin is not installed")
    cmd = [sys.executable, "-c", "import sys; from atlas_core.cli import main; sys.exit(main())",
           "serve", "--backend", "numpy", "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"(http://\S+)/v1", proc.stdout.readline()).group(1)
        assert wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, timeout=120)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()


@pytest.fixture(scope="module")
def oai(server_url):
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def claude(server_url):
    return anthropic.Anthropic(base_url=server_url, api_key="none", max_retries=0)


def ask(oai, content: str, **kwargs) -> str:
    out = oai.chat.completions.create(model="atlas-demo", temperature=0, max_tokens=48,
                                      messages=[{"role": "user", "content": content}], **kwargs)
    return out.choices[0].message.content.strip()


def test_served_under_its_name(oai):
    assert [m.id for m in oai.models.list().data] == ["atlas-demo"]


@pytest.mark.parametrize("question, answer", [
    ("What is 482 + 39?", "521"),
    ("What is the capital of France?", "Paris"),
    ("Compute 17 minus 905", "-888"),
])
def test_openai_chat_answers(oai, question, answer):
    assert answer in ask(oai, question)


def test_openai_streaming_answer(oai):
    stream = oai.chat.completions.create(model="atlas-demo", temperature=0, max_tokens=48, stream=True,
                                         messages=[{"role": "user", "content": "What is 250 + 250?"}])
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert "500" in text and "<think>" not in text


def test_anthropic_answers(claude):
    msg = claude.messages.create(model="atlas-demo", max_tokens=48,
                                 messages=[{"role": "user", "content": "What is the capital of Japan?"}])
    text = "".join(b.text for b in msg.content if b.type == "text")
    assert "Tokyo" in text and msg.stop_reason == "end_turn"


def test_openai_tool_round_trip(oai):
    messages = [{"role": "user", "content": "What's the weather in Lisbon?"}]
    first = oai.chat.completions.create(model="atlas-demo", temperature=0, max_tokens=48,
                                        messages=messages, tools=TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Lisbon"}
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": json.dumps(WEATHER)}]
    final = oai.chat.completions.create(model="atlas-demo", temperature=0, max_tokens=48,
                                        messages=messages, tools=TOOLS)
    assert final.choices[0].message.content.strip() == "The weather in Lisbon is sunny, 21°C."


def test_anthropic_tool_round_trip(claude):
    messages = [{"role": "user", "content": "What's the weather in Lisbon?"}]
    first = claude.messages.create(model="atlas-demo", max_tokens=48, messages=messages,
                                   tools=ANTHROPIC_TOOLS)
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "get_weather" and use.input == {"city": "Lisbon"}
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                               "content": json.dumps(WEATHER)}]}]
    final = claude.messages.create(model="atlas-demo", max_tokens=48, messages=messages,
                                   tools=ANTHROPIC_TOOLS)
    text = "".join(b.text for b in final.content if b.type == "text").strip()
    assert text == "The weather in Lisbon is sunny, 21°C."
