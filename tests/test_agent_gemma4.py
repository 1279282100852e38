"""Gemma-4 agent loop through the official OpenAI and Anthropic SDKs: the real Gemma-4 chat
template and the ``gemma4`` tool-call and reasoning parsers it selects, over a scripted model
that writes Gemma-4 markup (``<|channel>thought ... <channel|>``,
``<|tool_call>call:NAME{...}<tool_call|>``) token by token."""

from __future__ import annotations

import contextlib
import json
import shutil

import pytest

from atlas_core.testing.fixtures import real_models_dir
from atlas_core.testing.tiny_tokenizer import write_tokenizer

GEMMA4 = real_models_dir() / "gemma-4"
pytestmark = pytest.mark.skipif(not GEMMA4.is_dir(), reason="real-model fixtures not present")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

THOUGHT = "Need the weather tool."
CALL = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>'
ANSWER = "Sunny in Paris."
USER = [{"role": "user", "content": "Weather in Paris?"}]
OPENAI_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}}}}}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Weather of a city",
                  "input_schema": OPENAI_TOOL["function"]["parameters"]}


class GemmaScript:
    """``context -> forced token``: after a prompt ending in ``<|turn>model\\n``, the thought and
    the call; after one ending in a tool response (the template continues the same model turn
    there), the answer; then EOS."""

    def __init__(self, tokenizer, eos: int):
        self.tok, self.eos, self.replies = tokenizer, eos, {}

    def __call__(self, context: list[int]) -> int | None:
        for prompt, ids in self.replies.items():
            done = len(context) - len(prompt)
            if tuple(context[:len(prompt)]) == prompt and 0 <= done < len(ids) \
                    and context[len(prompt):] == ids[:done]:
                return ids[done]
        text = self.tok.decode(context, skip_special_tokens=False)
        if text.endswith("<tool_response|>"):
            reply = ANSWER
        elif text.endswith("<|turn>model\n"):
            reply = f"<|channel>thought\n{THOUGHT}\n<channel|>{CALL}"
        else:
            return None
        ids = self.tok.encode(reply) + [self.eos]
        self.replies[tuple(context)] = ids
        return ids[0]


@contextlib.contextmanager
def gemma4_server(tmp_path):
    from atlas_core.engine import AsyncLLMEngine
    from atlas_core.testing.fake_model import FakeCausalLM, make_fake_engine
    from atlas_core.plugins import Registry
    from atlas_core.server import ServerConfig, create_app
    from atlas_core.server.launch import ServerThread
    from atlas_core.tokenizer import Tokenizer

    ids = write_tokenizer(tmp_path, 384)
    config = json.loads((GEMMA4 / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="PreTrainedTokenizerFast", eos_token="<|im_end|>")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    shutil.copy(GEMMA4 / "chat_template.jinja", tmp_path / "chat_template.jinja")
    tok = Tokenizer.from_dir(tmp_path)
    eos = ids["<|im_end|>"]
    model = FakeCausalLM(Registry().create("gpu_backends", "numpy"), vocab_size=tok.vocab_size,
                         max_position_embeddings=4096, script=GemmaScript(tok, eos))
    model.config = {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text"}
    engine = AsyncLLMEngine(make_fake_engine(model, tokenizer=tok, eos_token_ids={eos},
                                             num_kv_blocks=256, max_num_seqs=4))
    app = create_app(engine, ServerConfig(served_model_names=["gemma"]))
    try:
        with ServerThread(app) as server:
            yield server
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with gemma4_server(tmp_path_factory.mktemp("gemma4-agent")) as srv:
        yield srv


def test_openai_tool_call_round_trip(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)
    first = client.chat.completions.create(model="gemma", messages=USER, tools=[OPENAI_TOOL],
                                           max_tokens=200).choices[0]
    assert first.finish_reason == "tool_calls"
    assert (first.message.model_extra or {}).get("reasoning_content") == THOUGHT
    call = first.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 2}
    history = USER + [first.message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    final = client.chat.completions.create(model="gemma", messages=history, tools=[OPENAI_TOOL],
                                           max_tokens=200).choices[0]
    assert (final.finish_reason, final.message.content) == ("stop", ANSWER)


def test_openai_streamed_call(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)
    content, arguments, names = "", "", []
    for chunk in client.chat.completions.create(model="gemma", messages=USER, stream=True,
                                                tools=[OPENAI_TOOL], max_tokens=200):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                names += [tc.function.name] if tc.function and tc.function.name else []
                arguments += (tc.function.arguments or "") if tc.function else ""
    assert (content, names, json.loads(arguments)) == ("", ["get_weather"],
                                                        {"city": "Paris", "days": 2})


def test_anthropic_tool_use_round_trip(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=60)
    first = client.messages.create(model="gemma", max_tokens=200, messages=USER,
                                   tools=[ANTHROPIC_TOOL])
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    use = first.content[1]
    assert (use.name, use.input) == ("get_weather", {"city": "Paris", "days": 2})
    history = USER + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "sunny"}]}]
    final = client.messages.create(model="gemma", max_tokens=200, messages=history,
                                   tools=[ANTHROPIC_TOOL])
    assert final.stop_reason == "end_turn"
    assert final.content[-1].text == ANSWER
