"""Tool-call round trips through the HTTP server and the official OpenAI SDK with the real
Nemotron chat templates, their auto-selected parsers and ``<think>`` reasoning.

- The tiny Nemotron-H checkpoint itself (numpy backend) with the Nemotron-3 Nano template and a
  forced tool choice: the grammar makes the random model write a ``<tool_call><function=...>``
  block, the server parses it into a call, and the tool result goes into the next prompt.
- A scripted model (the engine's fake, the checkpoint's tokenizer, the Nano-v2 template) for
  the ``auto`` choice in Nano-v2's ``<TOOLCALL>[...]</TOOLCALL>`` form: reasoning, content and
  a call, streamed and whole, then the answer once the tool result is in the prompt.
"""

from __future__ import annotations

import contextlib
import json
import shutil

import pytest
from nemotron_checkpoints import TEMPLATES

from atlas_core.api import (AsyncLLMEngine, EngineArgs, LLMEngine, Registry, ServerConfig,
                            ServerThread, Tokenizer, create_app)
from atlas_core.testing.fake_model import FakeCausalLM, make_fake_engine

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.timeout(300)

CITY = {"type": "string", "enum": ["Paris", "Rome"]}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": CITY}, "required": ["city"]}}}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
THOUGHT, ANSWER = "Need the weather tool.", "It is sunny in Paris."
CALL = '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>'
PROMPT_END = "<SPECIAL_11>Assistant\n<think>\n"


@contextlib.contextmanager
def serve(engine):
    async_engine = AsyncLLMEngine(engine)
    try:
        with ServerThread(create_app(async_engine, ServerConfig(served_model_names=["nh"]))) as srv:
            yield openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=120)
    finally:
        async_engine.shutdown()


def test_forced_call_from_the_tiny_checkpoint(checkpoint):
    engine = LLMEngine.from_args(EngineArgs(model=str(checkpoint), backend="numpy",
                                            num_kv_blocks=96, max_num_seqs=2))
    with serve(engine) as client:
        first = client.chat.completions.create(model="nh", messages=USER, tools=[WEATHER],
                                               tool_choice="required", parallel_tool_calls=False,
                                               max_tokens=120, temperature=0)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments)["city"] in CITY["enum"]
        turn = [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24 C"}]
        again = client.chat.completions.create(model="nh", messages=USER + turn, tools=[WEATHER],
                                               max_tokens=3, temperature=0)
        assert again.choices[0].finish_reason in ("length", "stop")
        assert again.usage.prompt_tokens > first.usage.prompt_tokens


class NanoV2Script:
    """``context -> forced token``: once the context ends with the Nano-v2 generation prompt,
    play the reply (thought, then content and the call, or the answer once a tool response is
    in the prompt) token by token, then end of sequence."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.plans = tokenizer, {}

    def __call__(self, context: list[int]) -> int | None:
        for prompt, ids in self.plans.items():
            done = len(context) - len(prompt)
            if 0 <= done < len(ids) and tuple(context[:len(prompt)]) == prompt \
                    and context[len(prompt):] == ids[:done]:
                return ids[done]
        text = self.tokenizer.decode(context, skip_special_tokens=False)
        if not text.endswith(PROMPT_END):
            return None
        reply = ANSWER if "<TOOL_RESPONSE>[sunny" in text else f"Checking.\n{CALL}"
        ids = self.tokenizer.encode(f"{THOUGHT}\n</think>\n\n{reply}")
        self.plans[tuple(context)] = ids + [min(self.tokenizer.eos_token_ids)]
        return ids[0]


@pytest.fixture(scope="module")
def scripted(checkpoint, tmp_path_factory):
    path = tmp_path_factory.mktemp("nano_v2")
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(checkpoint / name, path / name)
    tok_config = json.loads((path / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = TEMPLATES["nano_v2"].read_text(encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config))
    tok = Tokenizer.from_dir(path)
    model = FakeCausalLM(Registry().create("gpu_backends", "numpy"), vocab_size=tok.vocab_size,
                         max_position_embeddings=4096, script=NanoV2Script(tok))
    model.config = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h"}
    engine = make_fake_engine(model, tokenizer=tok, eos_token_ids=set(tok.eos_token_ids),
                              num_kv_blocks=256, max_num_seqs=4)
    with serve(engine) as client:
        yield client


def test_auto_toolcall_list_with_reasoning(scripted):
    client = scripted
    message = client.chat.completions.create(model="nh", messages=USER, tools=[WEATHER],
                                             max_tokens=200).choices[0].message
    assert message.model_extra["reasoning_content"] == THOUGHT
    assert message.content == "Checking."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    content, reasoning, calls = "", "", {}
    for chunk in client.chat.completions.create(model="nh", messages=USER, tools=[WEATHER],
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
    final = client.chat.completions.create(model="nh", messages=USER + turn, tools=[WEATHER],
                                           max_tokens=200).choices[0]
    assert final.finish_reason == "stop" and final.message.content == ANSWER
