"""Chat-template rendering that matches Hugging Face transformers byte for byte.

Templates come from model repositories and are untrusted code, so they run in jinja2's
``ImmutableSandboxedEnvironment`` with the same options, globals and filters that transformers
gives them (``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, ``raise_exception``,
``strftime_now``, a ``tojson`` that does not HTML-escape, a guarded ``dict`` and ``namespace``).
The inputs are prepared the way ``PreTrainedTokenizerBase.apply_chat_template`` prepares them:
message keys whose value is ``None`` are dropped, everything is rebuilt from plain JSON types,
and a message's reasoning is offered under ``reasoning_content`` and ``thinking`` alike.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(TemplateError, ValueError):
    """A chat template rejected the conversation or failed to render it."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """``dict`` as templates see it: callable and ``fromkeys``, nothing to climb through."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """``namespace()`` that refuses underscore-prefixed attribute names."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's own signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"chat templates cannot set underscore-prefixed attribute {name!r}")


@functools.lru_cache(maxsize=32)
def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template in the sandbox (cached by source text).

    Raises:
        ChatTemplateError: the template is not valid Jinja.
    """
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from exc


def plain_data(value: Any) -> Any:
    """Rebuild ``value`` from plain JSON types so a template sees no methods worth abusing.

    Mappings, lists, tuples, dataclasses and objects with ``model_dump`` are converted
    recursively; scalar subclasses are cut back to their base type; anything else becomes a
    placeholder string such as ``"<ndarray>"``, as transformers does.
    """
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_data(v) for v in value)
    if hasattr(value, "item") and type(value).__module__ == "numpy":
        return plain_data(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return plain_data(value.model_dump())
    if hasattr(value, "__struct_fields__"):
        return {name: plain_data(getattr(value, name)) for name in value.__struct_fields__}
    return f"<{type(value).__name__}>"


def prepare_messages(messages: list) -> list[dict]:
    """Messages as transformers hands them to a template.

    Raises:
        ChatTemplateError: the conversation is empty or a message is not a mapping.
    """
    if not messages:
        raise ChatTemplateError("cannot render an empty conversation: pass at least one message")
    prepared = []
    for message in plain_data(list(messages)):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"chat messages must be objects with a 'role', got {message!r}")
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        prepared.append(message)
    return prepared


def prepare_tools(tools: list | None) -> list | None:
    """Tool JSON schemas, passed through as given (``{"type": "function", "function": ...}`` or bare).

    Raises:
        ChatTemplateError: a tool is not a JSON-schema object.
    """
    if tools is None:
        return None
    tools = plain_data(list(tools))
    for tool in tools:
        if not isinstance(tool, dict):
            raise ChatTemplateError(f"tools must be JSON-schema objects, got {tool!r}")
    return tools


def render_chat_template(source: str, messages: list, *, tools: list | None = None,
                         documents: list | None = None, add_generation_prompt: bool = False,
                         **template_kwargs: Any) -> str:
    """Render a chat template exactly as ``apply_chat_template(..., tokenize=False)`` does.

    Args:
        source: the Jinja template text.
        messages: the conversation, a list of message mappings.
        tools: tool JSON schemas, or None.
        documents: retrieval documents (mappings with ``title`` / ``text``), or None.
        add_generation_prompt: append the header that opens an assistant turn.
        **template_kwargs: further template variables: special tokens (``bos_token``, ...) and
            switches such as ``enable_thinking``.

    Returns:
        The rendered prompt text.

    Raises:
        ChatTemplateError: the template rejected the conversation or failed while rendering.
    """
    template = compile_chat_template(source)
    if documents is not None and not all(isinstance(d, Mapping) for d in documents):
        raise ChatTemplateError("documents must be objects with 'title' and 'text' keys")
    variables = plain_data(template_kwargs)
    variables.update(messages=prepare_messages(messages), tools=prepare_tools(tools),
                     documents=plain_data(documents), add_generation_prompt=add_generation_prompt)
    try:
        return template.render(**variables)
    except ChatTemplateError:
        raise
    except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise ChatTemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from exc
