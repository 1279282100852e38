"""Tool-call round trips through the official OpenAI and Anthropic SDKs with the MiniMax-M2
chat template, parser and ``<think>`` reasoning.

- The tiny MiniMax-M2 checkpoint itself (numpy backend) with a forced tool choice: the grammar
  makes the random model write a ``<minimax:tool_call>`` block, the server parses it into a
  tool call, and the tool result goes back into the next prompt.
- A scripted model (the engine's fake, with the checkpoint's tokenizer and template) for the
  ``auto`` choice: reasoning, content and a call in one reply, streamed and whole; then the
  answer once the tool result is in the prompt.
"""

from __future__ import annotations

import contextlib
import json

import pytest

from atlas_core.api import (AsyncLLMEngine, EngineArgs, LLMEngine, Registry, ServerConfig,
                            ServerThread, Tokenizer, create_app)
from atlas_core.testing.fake_model import FakeCausalLM, make_fake_engine

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.timeout(300)

CITY = {"type": "string", "enum": ["Paris", "Rome"]}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": CITY}, "required": ["city"]}}}
TOOL = {"name": "get_weather", "description": "Current weather of a city",
        "input_schema": WEATHER["function"]["parameters"]}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
THOUGHT, ANSWER = "Need the weather tool.", "It is sunny in Paris."
CALL = ('<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris'
        '</parameter>\n</invoke>\n</minimax:tool_call>')
PROMPT_END = "]~b]ai\n<think>\n"


@contextlib.contextmanager
def serve(engine):
    async_engine = AsyncLLMEngine(engine)
    try:
        with ServerThread(create_app(async_engine, ServerConfig(served_model_names=["m2"]))) as srv:
            yield srv
    finally:
        async_engine.shutdown()


def clients(server):
    return (openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120),
            anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120))


@pytest.fixture(scope="module")
def real(checkpoint):
    engine = LLMEngine.from_args(EngineArgs(model=str(checkpoint), backend="numpy",
                                            num_kv_blocks=64, max_num_seqs=2))
    with serve(engine) as srv:
        yield clients(srv)


def test_forced_call_from_the_tiny_checkpoint_openai(real):
    client, _ = real
    first = client.chat.completions.create(model="m2", messages=USER, tools=[WEATHER],
                                           tool_choice="required", parallel_tool_calls=False,
                                           max_tokens=120, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in CITY["enum"]
    turn = [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24 C"}]
    with_result = client.chat.completions.create(model="m2", messages=USER + turn, tools=[WEATHER],
                                                 max_tokens=3, temperature=0)
    assert with_result.choices[0].finish_reason in ("length", "stop")
    assert with_result.usage.prompt_tokens > first.usage.prompt_tokens


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
                                          "content": "sunny, 24 C"}]}]
    final = client.messages.create(model="m2", max_tokens=3, messages=USER + turn, tools=[TOOL])
    assert final.stop_reason in ("max_tokens", "end_turn")


class MiniMaxScript:
    """``context -> forced token``: once the context ends with the M2 generation prompt
    (``]~b]ai\\n<think>\\n``), play the reply (thought, then the call, or the answer once a
    ``<response>`` is in the prompt) token by token, then end of sequence."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.plans = tokenizer, {}

    def reply(self, prompt: str) -> str:
        text = ANSWER if "<response>" in prompt else f"Checking.\n{CALL}"
        return f"{THOUGHT}\n</think>\n\n{text}"

    def __call__(self, context: list[int]) -> int | None:
        for prompt, ids in self.plans.items():
            done = len(context) - len(prompt)
            if 0 <= done < len(ids) and tuple(context[:len(prompt)]) == prompt \
                    and context[len(prompt):] == ids[:done]:
                return ids[done]
        text = self.tokenizer.decode(context, skip_special_tokens=False)
        if not text.endswith(PROMPT_END):
            return None
        ids = self.tokenizer.encode(self.reply(text)) + [min(self.tokenizer.eos_token_ids)]
        self.plans[tuple(context)] = ids
        return ids[0]


@pytest.fixture(scope="module")
def scripted(checkpoint):
    tok = Tokenizer.from_dir(checkpoint)
    backend = Registry().create("gpu_backends", "numpy")
    model = FakeCausalLM(backend, vocab_size=tok.vocab_size, max_position_embeddings=4096,
                         script=MiniMaxScript(tok))
    model.config = {"architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2"}
    engine = make_fake_engine(model, tokenizer=tok, eos_token_ids=set(tok.eos_token_ids),
                              num_kv_blocks=256, max_num_seqs=4)
    with serve(engine) as srv:
        yield clients(srv)


def test_auto_call_with_reasoning_openai(scripted):
    client, _ = scripted
    message = client.chat.completions.create(model="m2", messages=USER, tools=[WEATHER],
                                             max_tokens=200).choices[0].message
    assert message.model_extra["reasoning_content"] == THOUGHT
    assert message.content == "Checking."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    content, reasoning, calls = "", "", {}
    for chunk in client.chat.completions.create(model="m2", messages=USER, tools=[WEATHER],
                                                max_tokens=200, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            for tc in choice.delta.tool_calls or []:
                calls.setdefault(tc.index, ["", ""])
                calls[tc.index][0] += tc.function.name or ""
                calls[tc.index][1] += tc.function.arguments or ""
    assert (content, reasoning) == ("Checking.", THOUGHT)
    assert [(n, json.loads(a)) for n, a in calls.values()] == [("get_weather", {"city": "Paris"})]
    call = message.tool_calls[0]
    turn = [{"role": "assistant", "content": message.content, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24 C"}]
    final = client.chat.completions.create(model="m2", messages=USER + turn, tools=[WEATHER],
                                           max_tokens=200).choices[0]
    assert final.finish_reason == "stop" and final.message.content == ANSWER


def test_auto_call_with_thinking_anthropic(scripted):
    _, client = scripted
    first = client.messages.create(model="m2", max_tokens=200, messages=USER, tools=[TOOL])
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["thinking", "text", "tool_use"]
    thinking, text, use = first.content
    assert (thinking.thinking, text.text) == (THOUGHT, "Checking.")
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
