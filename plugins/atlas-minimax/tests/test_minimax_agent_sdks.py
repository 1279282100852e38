"""Tool-call round trips through the official OpenAI and Anthropic SDKs with the MiniMax-M2
chat template, parser and ``<think>`` reasoning.

- The tiny MiniMax-M2 checkpoint itself (numpy backend) with a forced tool choice: the grammar
  makes the random model write a ``<minimax:tool_call>`` block, the server parses it into a
  tool call, and the tool result goes back into the next prompt.
- A scripted model (the engine's fake, with the checkpoint's tokenizer and template) for the
  ``auto`` choice: reasoning, content and a call in one reply, streamed and whole; then the
  answer once the tool result is in the prompt.

The OpenAI round trips are :mod:`atlas_core.testing.serving`'s.
"""

from __future__ import annotations

import pytest

from atlas_core.api import EngineArgs, LLMEngine, Tokenizer
from atlas_core.testing.serving import (ANSWER, CITY, CONTENT, THOUGHT, TOOL_RESULT, USER,
                                        WEATHER, ToolCallScript, check_auto_tool_call,
                                        check_forced_tool_call, openai_client, scripted_engine,
                                        serve)

pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.timeout(300)

TOOL = {"name": "get_weather", "description": "Current weather of a city",
        "input_schema": WEATHER["function"]["parameters"]}
CALL = ('<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris'
        '</parameter>\n</invoke>\n</minimax:tool_call>')
PROMPT_END = "]~b]ai\n<think>\n"


def clients(server):
    return (openai_client(server),
            anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120))


@pytest.fixture(scope="module")
def real(checkpoint):
    engine = LLMEngine.from_args(EngineArgs(model=str(checkpoint), backend="numpy",
                                            num_kv_blocks=64, max_num_seqs=2))
    with serve(engine, "m2") as srv:
        yield clients(srv)


def test_forced_call_from_the_tiny_checkpoint_openai(real):
    client, _ = real
    check_forced_tool_call(client, "m2")


def test_forced_call_from_the_tiny_checkpoint_anthropic(real):
    _, client = real
    first = client.messages.create(model="m2", max_tokens=120, messages=USER, tools=[TOOL],
                                   tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "get_weather" and use.input["city"] in CITY["enum"]
    blocks = [b.model_dump(exclude_none=True) for b in first.content]
    turn = [{"role": "assistant", "content": blocks},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": TOOL_RESULT}]}]
    final = client.messages.create(model="m2", max_tokens=3, messages=USER + turn, tools=[TOOL])
    assert final.stop_reason in ("max_tokens", "end_turn")


@pytest.fixture(scope="module")
def scripted(checkpoint):
    tok = Tokenizer.from_dir(checkpoint)
    # M2 renders a tool result as <response>...</response>
    script = ToolCallScript(tok, PROMPT_END, CALL, answered="<response>")
    engine = scripted_engine(tok, script, {"architectures": ["MiniMaxM2ForCausalLM"],
                                           "model_type": "minimax_m2"})
    with serve(engine, "m2") as srv:
        yield clients(srv)


def test_auto_call_with_reasoning_openai(scripted):
    client, _ = scripted
    check_auto_tool_call(client, "m2")


def test_auto_call_with_thinking_anthropic(scripted):
    _, client = scripted
    first = client.messages.create(model="m2", max_tokens=200, messages=USER, tools=[TOOL])
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["thinking", "text", "tool_use"]
    thinking, text, use = first.content
    assert (thinking.thinking, text.text) == (THOUGHT, CONTENT)
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    blocks = [b.model_dump(exclude_none=True) for b in first.content]
    turn = [{"role": "assistant", "content": blocks},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": [{"type": "text", "text": "sunny"}]}]}]
    with client.messages.stream(model="m2", max_tokens=200, messages=USER + turn,
                                tools=[TOOL]) as stream:
        answer = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert answer == ANSWER and final.stop_reason == "end_turn"
