"""Lark grammars (llguidance dialect) that force valid tool calls in a model's own format.

Each grammar accepts exactly the texts the matching parser of :mod:`atlas_core.parsers` reads
as calls of the given functions with arguments valid against their parameter schemas:

- ``hermes``: ``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``
- ``qwen3_coder``: ``<tool_call>\\n<function=f>\\n<parameter=k>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>``
- ``mistral``: ``[TOOL_CALLS][{"name": "f", "arguments": {...}}]``
- ``llama3_json``: ``{"name": "f", "parameters": {...}}`` (parallel calls joined by ``; ``)
- ``minimax_m2``: ``<minimax:tool_call>\\n<invoke name="f">\\n<parameter name="k">value</parameter>\\n``
  ``</invoke>\\n</minimax:tool_call>`` (parallel calls: more ``<invoke>`` blocks in one block)

JSON is written with ``", "`` and ``": "`` separators (what chat templates' ``tojson`` renders).
"""

from __future__ import annotations

import json
from typing import Callable

from atlas_core.guided.params import ToolCallSpec

#: llguidance JSON options used everywhere: compact, ``json.dumps``-style separators.
JSON_OPTIONS = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}

# Substrings that end a qwen3_coder value early in the parser, so a raw string value may not hold them.
_XML_STOPS = r"<\/parameter>|<parameter=|<\/function>|<\/tool_call>"
_MINIMAX_STOPS = r"<\/parameter>|<parameter name=|<\/invoke>|<\/minimax:tool_call>"


def with_json_options(schema: dict | bool) -> dict | bool:
    """``schema`` with :data:`JSON_OPTIONS` as ``x-guidance`` defaults (its own settings win)."""
    if not isinstance(schema, dict):
        return schema
    return {**schema, "x-guidance": {**JSON_OPTIONS, **schema.get("x-guidance", {})}}


def lit(text: str) -> str:
    """``text`` as a Lark string literal."""
    return json.dumps(text)


def json_rule(name: str, schema: dict | bool) -> str:
    """A rule ``name`` matching JSON valid against ``schema``."""
    return f"{name}: %json {json.dumps(with_json_options(schema))}"


def closed_parameters(schema: dict) -> dict:
    """A tool's parameter schema without undeclared top-level arguments (unless it allows them).

    Models are prompted with the declared parameters only, and the qwen3_coder form can only
    carry those, so every format forces the same set.
    """
    if schema.get("type") == "object" and "additionalProperties" not in schema:
        return {**schema, "additionalProperties": False}
    return schema


def _json_calls(spec: ToolCallSpec, args_key: str) -> list[str]:
    rules = ["fn: " + " | ".join(f"fn_{i}" for i in range(len(spec.tools)))]
    for i, tool in enumerate(spec.tools):
        head = '{"name": ' + json.dumps(tool["name"]) + f', "{args_key}": '
        rules.append(f"fn_{i}: {lit(head)} args_{i} {lit('}')}")
        rules.append(json_rule(f"args_{i}", closed_parameters(tool["parameters"])))
    return rules


def _repeat(item: str, separator: str, spec: ToolCallSpec) -> str:
    if not spec.parallel or spec.max_calls == 1:
        return item
    more = "*" if spec.max_calls is None else f"{{0,{spec.max_calls - 1}}}"
    return f"{item} ({lit(separator)} {item}){more}"


def hermes(spec: ToolCallSpec, marker: Callable[[str], str]) -> list[str]:
    call = f"{marker('<tool_call>')} {lit(chr(10))} fn {lit(chr(10))} {marker('</tool_call>')}"
    return [f"start: {_repeat('call', chr(10), spec)}", f"call: {call}",
            *_json_calls(spec, "arguments")]


def mistral(spec: ToolCallSpec, marker: Callable[[str], str]) -> list[str]:
    calls = _repeat("fn", ", ", spec)
    return [f"start: {marker('[TOOL_CALLS]')} {lit('[')} {calls} {lit(']')}",
            *_json_calls(spec, "arguments")]


def llama3_json(spec: ToolCallSpec, marker: Callable[[str], str]) -> list[str]:
    return [f"start: {_repeat('fn', '; ', spec)}", *_json_calls(spec, "parameters")]


def _is_string(schema: dict | bool) -> bool:
    kind = schema.get("type") if isinstance(schema, dict) else None
    return "string" in (kind if isinstance(kind, list) else [kind])


def _xml_value(name: str, schema: dict | bool, close_tag: str = "\n</parameter>\n",
               stops: str = _XML_STOPS) -> list[str]:
    """Rules for one XML parameter value and its closing tag (qwen3_coder's by default;
    minimax_m2 passes its own ``close_tag`` and ``stops``).

    String values are raw text (the parser keeps them as is; ``format`` and ``pattern`` are not
    enforced), ended lazily at the first closing tag (a greedy text lexeme would swallow the
    tag's first bytes); other values are JSON, which the parser decodes by the schema's type.
    """
    close = lit(close_tag)
    if not _is_string(schema):
        return [f"{name}: {name}_json {close}", json_rule(f"{name}_json", schema)]
    if "enum" in schema or "const" in schema:
        options = schema.get("enum", [schema.get("const")])
        return [f"{name}: ({' | '.join(lit(str(v)) for v in options)}) {close}"]
    low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
    count = f"{{{low},{'' if high is None else int(high)}}}"
    terminal = name.upper()
    return [f"{terminal}: /(?s:.){count}/ & ~/(?s:.*)({stops})(?s:.*)/",
            f"{name}[suffix={close}]: {terminal}"]


def qwen3_coder(spec: ToolCallSpec, marker: Callable[[str], str]) -> list[str]:
    nl = lit("\n")
    rules = [f"start: {_repeat('call', chr(10), spec)}",
             f"call: {marker('<tool_call>')} {nl} fn {marker('</tool_call>')}",
             "fn: " + " | ".join(f"fn_{i}" for i in range(len(spec.tools)))]
    for i, tool in enumerate(spec.tools):
        schema = tool["parameters"]
        props = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        parts = []
        for j, (key, sub) in enumerate(props.items()):
            rule = f"p_{i}_{j}"
            rules.append(f"{rule}: {lit(f'<parameter={key}>' + chr(10))} v_{i}_{j}")
            rules.extend(_xml_value(f"v_{i}_{j}", sub))
            parts.append(rule if key in required else f"{rule}?")
        body = " ".join([lit(f"<function={tool['name']}>\n"), *parts, lit("</function>\n")])
        rules.append(f"fn_{i}: {body}")
    return rules


def minimax_m2(spec: ToolCallSpec, marker: Callable[[str], str]) -> list[str]:
    more = "" if not spec.parallel or spec.max_calls == 1 else (
        " fn*" if spec.max_calls is None else f" fn{{0,{spec.max_calls - 1}}}")
    rules = [f"start: {marker('<minimax:tool_call>')} {lit(chr(10))} fn{more} "
             f"{marker('</minimax:tool_call>')}",
             "fn: " + " | ".join(f"fn_{i}" for i in range(len(spec.tools)))]
    for i, tool in enumerate(spec.tools):
        schema = tool["parameters"]
        required = set(schema.get("required") or ())
        parts = []
        for j, (key, sub) in enumerate((schema.get("properties") or {}).items()):
            rule = f"p_{i}_{j}"
            rules.append(f"{rule}: {lit(f'<parameter name={json.dumps(key)}>')} v_{i}_{j}")
            rules.extend(_xml_value(f"v_{i}_{j}", sub, "</parameter>\n", _MINIMAX_STOPS))
            parts.append(rule if key in required else f"{rule}?")
        head = f'<invoke name={json.dumps(tool["name"])}>\n'
        rules.append(f"fn_{i}: {' '.join([lit(head), *parts, lit('</invoke>' + chr(10))])}")
    return rules


FORMATS = {"hermes": hermes, "qwen3_coder": qwen3_coder, "mistral": mistral,
           "llama3_json": llama3_json, "minimax_m2": minimax_m2}


def tool_call_lark(spec: ToolCallSpec, special_token_id: Callable[[str], int | None]) -> str:
    """The Lark grammar forcing calls of ``spec.tools`` in ``spec.format``.

    Args:
        spec: the functions, format and whether parallel calls are allowed.
        special_token_id: id of a marker (e.g. ``[TOOL_CALLS]``) when it is a special token of
            the model's tokenizer (matched by id, as such tokens never match text), else None.
    """
    def marker(text: str) -> str:
        tid = special_token_id(text)
        return lit(text) if tid is None else f"<[{tid}]>"

    return "%llguidance {}\n" + "\n".join(FORMATS[spec.format](spec, marker)) + "\n"
