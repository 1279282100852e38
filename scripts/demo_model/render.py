"""Chat-template rendering for the demo corpus, matching HF transformers' `apply_chat_template`.

The template is the Qwen3 chat template (``chat_template.jinja`` beside this file, Apache-2.0 model
data from Qwen/Qwen3). The Jinja environment mirrors the one transformers builds, so the training
text is byte-identical to what Atlas and transformers render at inference time.
"""

import json
from functools import lru_cache
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


@lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(TEMPLATE_PATH.read_text())


def chat_template_text() -> str:
    """Returns the chat template source shipped in tokenizer_config.json."""
    return TEMPLATE_PATH.read_text()


def render(messages, tools=None, *, add_generation_prompt=False, enable_thinking=True) -> str:
    """Renders a conversation the way `tokenizer.apply_chat_template(..., tokenize=False)` does.

    Args:
        messages: OpenAI-style message dicts (role, content, optional tool_calls).
        tools: OpenAI-style tool definitions, or None.
        add_generation_prompt: append the ``<|im_start|>assistant\\n`` header.
        enable_thinking: when False, the generation prompt also holds an empty think block.
    """
    kwargs = {} if enable_thinking else {"enable_thinking": False}
    return _template().render(messages=messages, tools=tools,
                              add_generation_prompt=add_generation_prompt, bos_token=None,
                              eos_token="<|im_end|>", **kwargs)


def split_example(messages, tools=None, enable_thinking=True) -> tuple[str, str]:
    """Splits a conversation into (prompt, completion) text for training on the last turn.

    The prompt is what a server renders for ``messages[:-1]`` with the generation prompt; the
    completion is the rest of the full rendering (the last assistant turn and ``<|im_end|>``).
    """
    prompt = render(messages[:-1], tools, add_generation_prompt=True,
                    enable_thinking=enable_thinking)
    full = render(messages, tools, enable_thinking=enable_thinking)
    if not full.startswith(prompt):
        raise ValueError(f"rendered prompt is not a prefix of the conversation: {prompt!r}")
    return prompt, full[len(prompt):]
