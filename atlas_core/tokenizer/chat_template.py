"""Chat-template rendering that matches Hugging Face transformers byte for byte.

Templates come from model repositories and are untrusted code, so they run in jinja2's
``ImmutableSandboxedEnvironment`` with the same options, globals and filters that transformers
gives them (``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, ``raise_exception``,
``strftime_now``, a ``tojson`` that does not HTML-escape, a guarded ``dict`` and ``namespace``).
The inputs are prepared the way ``PreTrainedTokenizerBase.apply_chat_template`` prepares them:
message keys whose value is ``None`` are dropped, everything is rebuilt from plain JSON types,
and a message's reasoning is offered under ``reasoning_content`` and ``thinking`` alike.
Servers may first bring tool-call ``arguments`` to the kind a template reads
(:func:`tool_arguments_form`, :func:`adapt_tool_arguments`); :func:`load_chat_template` reads
a ``--chat-template`` override.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.utils
from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_MAPPING_FILTERS = ("tojson", "items", "dictsort")


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


def _is_arguments(node: nodes.Node, aliases: set[str]) -> bool:
    if isinstance(node, nodes.Getattr):
        return node.attr == "arguments"
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value == "arguments"
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name in aliases


def _use_of_arguments(node: nodes.Node, parent: nodes.Node) -> str | None:
    """How ``parent`` uses the ``arguments`` expression ``node``: ``"check"`` (a type test),
    ``"mapping"``, ``"string"`` or None (nothing that needs either)."""
    if isinstance(parent, nodes.Test) and parent.node is node:
        return "check" if parent.name in ("string", "mapping") else None
    if isinstance(parent, nodes.Filter) and parent.node is node:
        return "mapping" if parent.name in _MAPPING_FILTERS else None
    if isinstance(parent, nodes.Getattr) and parent.node is node:
        return "mapping" if parent.attr in ("items", "keys", "values", "get") else None
    if isinstance(parent, nodes.Getitem) and parent.node is node:
        return "mapping"
    if isinstance(parent, nodes.For) and parent.iter is node:
        return "mapping"
    if isinstance(parent, (nodes.Add, nodes.Concat, nodes.Output)):
        return "string"
    return None


@functools.lru_cache(maxsize=32)
def tool_arguments_form(source: str) -> str:
    """What a template can render as a tool call's ``arguments``.

    ``"mapping"`` when it only reads them as an object (``|tojson``, ``|items``, ``.items()``,
    a loop or an index), ``"string"`` when it only joins or prints them as text (DeepSeek-V3.1's
    ``'...' + tool['function']['arguments']``), ``"any"`` when it tests their type
    (``is string`` / ``is mapping``), uses them both ways or not at all.
    """
    try:
        tree = compile_chat_template(source).environment.parse(source)
    except TemplateError:
        return "any"
    aliases = {a.target.name for a in tree.find_all(nodes.Assign)
               if isinstance(a.target, nodes.Name) and _is_arguments(a.node, set())}
    uses: set[str] = set()
    stack: list[nodes.Node] = [tree]
    while stack:
        parent = stack.pop()
        for child in parent.iter_child_nodes():
            if _is_arguments(child, aliases):
                uses.add(_use_of_arguments(child, parent))
            stack.append(child)
    uses.discard(None)
    return uses.pop() if len(uses) == 1 and "check" not in uses else "any"


def adapt_tool_arguments(messages: list[dict], form: str) -> list[dict]:
    """``messages`` with each tool call's ``arguments`` in ``form`` (from
    :func:`tool_arguments_form`): JSON text parsed to an object for ``"mapping"``, an object
    written as JSON text for ``"string"``; ``"any"`` changes nothing.

    transformers passes arguments as given, so a template fails (or prints Python reprs) when
    a client sends the other kind; servers call this before rendering.
    """
    if form == "any":
        return messages
    return [{**m, "tool_calls": [_adapt_call(c, form) for c in m["tool_calls"]]}
            if isinstance(m, dict) and isinstance(m.get("tool_calls"), list) else m
            for m in messages]


def _adapt_call(call: Any, form: str) -> Any:
    if not isinstance(call, dict):
        return call
    call = dict(call)
    if isinstance(call.get("function"), dict):
        call["function"] = _adapt_call(call["function"], form)
    if "arguments" in call:
        call["arguments"] = _adapt_arguments(call["arguments"], form)
    return call


def _adapt_arguments(arguments: Any, form: str) -> Any:
    if form == "string" and isinstance(arguments, (dict, list)):
        return json.dumps(arguments, ensure_ascii=False)
    if form == "mapping" and isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        return parsed if isinstance(parsed, dict) else arguments
    return arguments


def load_chat_template(value: str) -> str:
    """A ``--chat-template`` value as template text: the contents of the file it names, else
    the value itself when it is Jinja (holds ``{{`` or ``{%``). The template is compiled.

    Raises:
        ChatTemplateError: neither a readable file nor a template, or not valid Jinja.
    """
    path = Path(value).expanduser()
    try:
        is_file = len(value) < 4096 and path.is_file()
    except OSError:
        is_file = False
    if is_file:
        try:
            value = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ChatTemplateError(f"cannot read chat template {path}: {exc}") from None
    elif "{{" not in value and "{%" not in value:
        raise ChatTemplateError(f"chat template {value!r} is neither a file nor a Jinja template "
                                "(no {{ or {%); pass a path to a .jinja file or the template text")
    compile_chat_template(value)
    return value


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
