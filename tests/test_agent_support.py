"""A scripted agent model for the agent tests: the real Qwen3 tokenizer and chat template over
the engine's fake model, whose logits force a fixed reply chosen from the prompt.

No tests here; imported by tests/test_agent_*.py and tests/test_responses_api.py.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Callable

from atlas_core.testing.fixtures import real_models_dir

QWEN3 = real_models_dir() / "qwen3"
IM_START, IM_END, TOOL_RESPONSE = 151644, 151645, 151665

CALL = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
ANSWER = "It is sunny in Paris."
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@functools.cache
def qwen3_tokenizer():
    from atlas_core.tokenizer import Tokenizer
    return Tokenizer.from_dir(QWEN3)


def output_start(context: list[int]) -> int:
    """Index where the reply starts: after the last ``<|im_start|>assistant\\n`` (and the
    empty think block a thinking-off prompt renders)."""
    tok = qwen3_tokenizer()
    header = [IM_START] + tok.encode("assistant\n")
    empty_think = tok.encode("<think>\n\n</think>\n\n")
    for i in range(len(context) - len(header), -1, -1):
        if context[i:i + len(header)] == header:
            start = i + len(header)
            if context[start:start + len(empty_think)] == empty_think:
                start += len(empty_think)
            return start
    return len(context)


class AgentScript:
    """``context -> forced token``: plays ``reply(context)`` (text) token by token, then
    ``<|im_end|>``. ``reply`` sees the whole context (e.g. to answer once a tool result is
    there); the prompt must be the only text before the reply starts.
    """

    def __init__(self, reply: Callable[[list[int]], str]):
        self.reply = reply
        self._cache: dict[tuple, list[int]] = {}

    def __call__(self, context: list[int]) -> int | None:
        start = output_start(context)
        prompt = tuple(context[:start])
        if prompt not in self._cache:
            self._cache[prompt] = qwen3_tokenizer().encode(self.reply(list(prompt))) + [IM_END]
        ids, done = self._cache[prompt], len(context) - start
        if done < len(ids) and context[start:] == ids[:done]:
            return ids[done]
        return None


def tool_then_answer(call: str = CALL, answer: str = ANSWER, think: str | None = None):
    """Reply with ``call`` until a ``<tool_response>`` is in the prompt, then ``answer``
    (both after a ``<think>`` block when ``think`` is given)."""
    def reply(prompt: list[int]) -> str:
        text = answer if TOOL_RESPONSE in prompt else call
        return f"<think>\n{think}\n</think>\n\n{text}" if think is not None else text
    return reply


def agent_engine(script: Callable[[list[int]], int | None], **engine_kwargs):
    """An ``AsyncLLMEngine`` over a scripted fake model with the Qwen3 tokenizer."""
    from atlas_core.engine import AsyncLLMEngine
    from atlas_core.testing.fake_model import FakeCausalLM, make_fake_engine
    from atlas_core.plugins import Registry

    tok = qwen3_tokenizer()
    backend = Registry().create("gpu_backends", "numpy")
    model = FakeCausalLM(backend, vocab_size=tok.vocab_size, max_position_embeddings=4096,
                         script=script)
    model.config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
    kwargs = {"num_kv_blocks": 256, "max_num_seqs": 4, **engine_kwargs}
    return AsyncLLMEngine(make_fake_engine(model, tokenizer=tok,
                                           eos_token_ids=set(tok.eos_token_ids), **kwargs))


@contextlib.contextmanager
def agent_server(reply: Callable[[list[int]], str] | None = None, *,
                 script: Callable[[list[int]], int | None] | None = None, **config):
    """A served scripted model (``server.url``): ``reply`` through :class:`AgentScript`, or a
    raw ``script``; ``config`` goes to ``ServerConfig``."""
    from atlas_core.server import ServerConfig, create_app
    from atlas_core.server.launch import ServerThread

    engine = agent_engine(script or AgentScript(reply))
    app = create_app(engine, ServerConfig(served_model_names=["agent"], **config))
    try:
        with ServerThread(app) as server:
            server.app = app
            yield server
    finally:
        engine.shutdown()
