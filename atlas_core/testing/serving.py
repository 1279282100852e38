"""Tool-call round trips through the HTTP server and the official OpenAI SDK, for the model
plugins that check their chat template and tool-call parser end to end.

A plugin's serve test runs two kinds of engine behind :func:`serve`:

- its tiny checkpoint (numpy backend) with a forced tool choice, where the grammar makes the
  random model write a call in the plugin's format: :func:`check_forced_tool_call`;
- the engine's fake model playing a fixed reply (:class:`ToolCallScript`,
  :func:`scripted_engine`) for the ``auto`` choice: reasoning, content and a call, streamed
  and whole, then the answer once the tool result is in the prompt: :func:`check_auto_tool_call`.

Both use the same conversation: :data:`USER` asks for the weather in Paris, :data:`WEATHER` is
the tool, :data:`TOOL_RESULT` the tool's answer. ``openai`` (a dev dependency) is imported only
by :func:`openai_client`; tests should ``pytest.importorskip("openai")`` first.

For tests that start ``atlas serve`` as a subprocess: :func:`free_port` and
:func:`wait_healthy`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.request
from typing import Any, Iterator

#: The ``city`` argument's schema: a forced call must pick one of these.
CITY = {"type": "string", "enum": ["Paris", "Rome"]}
#: The one tool of the conversation, in OpenAI form.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": CITY}, "required": ["city"]}}}
#: The user turn that starts every round trip.
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
#: What the scripted model thinks, says before its call, and answers after the tool result.
THOUGHT, CONTENT, ANSWER = "Need the weather tool.", "Checking.", "It is sunny in Paris."
#: The tool result sent back in the second request.
TOOL_RESULT = "sunny, 24 C"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(proc: Any, port: int, timeout: float = 120.0) -> None:
    """Wait until the server subprocess ``proc`` answers ``GET /health`` with 200 on ``port``.

    Raises:
        AssertionError: it exited first (with its output when captured) or ``timeout`` passed.
    """
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            out = proc.stdout.read() if getattr(proc, "stdout", None) else ""
            raise AssertionError(f"the server exited ({proc.returncode}): {out}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the server did not become healthy in {timeout} s")
        time.sleep(0.3)


@contextlib.contextmanager
def serve(engine: Any, model_name: str) -> Iterator[Any]:
    """Serve ``engine`` (an ``LLMEngine``) as ``model_name`` from a background thread.

    Yields the running :class:`~atlas_core.server.launch.ServerThread` (``.url``); the async
    engine wrapped around ``engine`` is shut down on exit.
    """
    from atlas_core.api import AsyncLLMEngine, ServerConfig, ServerThread, create_app

    async_engine = AsyncLLMEngine(engine)
    try:
        app = create_app(async_engine, ServerConfig(served_model_names=[model_name]))
        with ServerThread(app) as server:
            yield server
    finally:
        async_engine.shutdown()


def openai_client(server: Any) -> Any:
    """An ``openai.OpenAI`` client of ``server`` (no retries, a 120 s timeout)."""
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)


class ToolCallScript:
    """A :class:`~atlas_core.testing.fake_model.FakeCausalLM` script (``context -> forced
    token``) that plays one reply per prompt.

    Once the decoded context ends with ``prompt_end`` (the template's generation prompt, its
    ``<think>`` opened), the reply is :data:`THOUGHT`, ``</think>``, then :data:`CONTENT` and
    ``call``, or :data:`ANSWER` once ``answered`` (how the template renders the tool result)
    is in the prompt; token by token, then the lowest end-of-sequence id.

    Args:
        tokenizer: the served model's :class:`~atlas_core.tokenizer.Tokenizer`.
        prompt_end: text every generation prompt of the template ends with.
        call: the tool call in the plugin's format, as the model writes it.
        answered: text found in the prompt once the tool result is there.
    """

    def __init__(self, tokenizer: Any, prompt_end: str, call: str, answered: str) -> None:
        self.tokenizer, self.prompt_end = tokenizer, prompt_end
        self.call, self.answered = call, answered
        self.plans: dict[tuple[int, ...], list[int]] = {}

    def reply(self, prompt: str) -> str:
        """The reply text to the decoded ``prompt``."""
        text = ANSWER if self.answered in prompt else f"{CONTENT}\n{self.call}"
        return f"{THOUGHT}\n</think>\n\n{text}"

    def __call__(self, context: list[int]) -> int | None:
        for prompt, ids in self.plans.items():
            done = len(context) - len(prompt)
            if 0 <= done < len(ids) and tuple(context[:len(prompt)]) == prompt \
                    and context[len(prompt):] == ids[:done]:
                return ids[done]
        text = self.tokenizer.decode(context, skip_special_tokens=False)
        if not text.endswith(self.prompt_end):
            return None
        ids = self.tokenizer.encode(self.reply(text)) + [min(self.tokenizer.eos_token_ids)]
        self.plans[tuple(context)] = ids
        return ids[0]


def scripted_engine(tokenizer: Any, script: Any, config: dict[str, Any]) -> Any:
    """An ``LLMEngine`` over the fake model (numpy backend) driven by ``script``, with
    ``tokenizer``'s vocabulary and end-of-sequence ids, 4096 positions, 256 KV blocks and 4
    sequences. ``config`` (``architectures``, ``model_type``) picks the server's tool-call and
    reasoning parsers."""
    from atlas_core.plugins import Registry
    from atlas_core.testing.fake_model import FakeCausalLM, make_fake_engine

    backend = Registry().create("gpu_backends", "numpy")
    model = FakeCausalLM(backend, vocab_size=tokenizer.vocab_size, max_position_embeddings=4096,
                         script=script)
    model.config = dict(config)
    return make_fake_engine(model, tokenizer=tokenizer, eos_token_ids=set(tokenizer.eos_token_ids),
                            num_kv_blocks=256, max_num_seqs=4)


def check_forced_tool_call(client: Any, model: str) -> None:
    """``tool_choice="required"``: one well-formed call to ``get_weather`` with a city of
    :data:`CITY`; sending its result back makes a longer prompt that still completes."""
    first = client.chat.completions.create(model=model, messages=USER, tools=[WEATHER],
                                           tool_choice="required", parallel_tool_calls=False,
                                           max_tokens=120, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in CITY["enum"]
    turn = [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT}]
    again = client.chat.completions.create(model=model, messages=USER + turn, tools=[WEATHER],
                                           max_tokens=3, temperature=0)
    assert again.choices[0].finish_reason in ("length", "stop")
    assert again.usage.prompt_tokens > first.usage.prompt_tokens


def check_auto_tool_call(client: Any, model: str) -> None:
    """The ``auto`` choice against a :class:`ToolCallScript` model: the reasoning, the content
    and the call come back parsed, whole and streamed alike; with the tool result in the
    prompt, the reply is :data:`ANSWER` and ends with ``stop``."""
    message = client.chat.completions.create(model=model, messages=USER, tools=[WEATHER],
                                             max_tokens=200).choices[0].message
    assert message.model_extra["reasoning_content"] == THOUGHT
    assert message.content == CONTENT
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    content, reasoning, calls = "", "", {}
    for chunk in client.chat.completions.create(model=model, messages=USER, tools=[WEATHER],
                                                max_tokens=200, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            for tc in choice.delta.tool_calls or []:
                calls.setdefault(tc.index, ["", ""])
                calls[tc.index][0] += tc.function.name or ""
                calls[tc.index][1] += tc.function.arguments or ""
    assert (content, reasoning) == (CONTENT, THOUGHT)
    assert [(n, json.loads(a)) for n, a in calls.values()] == [("get_weather", {"city": "Paris"})]
    call = message.tool_calls[0]
    turn = [{"role": "assistant", "content": message.content, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT}]
    final = client.chat.completions.create(model=model, messages=USER + turn, tools=[WEATHER],
                                           max_tokens=200).choices[0]
    assert final.finish_reason == "stop" and final.message.content == ANSWER
