"""Qwen3-Coder / Qwen3.5 / Nemotron-3 XML tool calls.

``<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>``; values
are raw text, converted to the types the tool's JSON schema declares when the tools are known.
"""

from __future__ import annotations

import json
import re
from typing import Any

from atlas_core.parsers.base import CallMatch, ToolParser

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)


def _trim(value: str) -> str:
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _schema_types(schema: dict) -> list[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    options = schema.get("anyOf") or schema.get("oneOf") or []
    return [k for option in options if isinstance(option, dict) for k in _schema_types(option)]


def convert_value(value: str, schema: dict | None) -> Any:
    """``value`` as the first type of ``schema`` it is valid for; the raw text when none fits."""
    if not isinstance(schema, dict):
        return value
    types = _schema_types(schema)
    if value.strip().lower() == "null" and types and ("null" in types or types[0] != "string"):
        return None
    if types[:1] == ["string"]:
        return value
    for kind in types:
        text = value.strip()
        if kind == "boolean" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if kind in ("integer", "number", "object", "array"):
            try:
                parsed = json.loads(text)
            except ValueError:
                continue
            ok = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool)
                  or isinstance(v, float) and v.is_integer(),
                  "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
                  "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list)}[kind]
            if ok(parsed):
                return int(parsed) if kind == "integer" else parsed
    return value


class Qwen3CoderToolParser(ToolParser):
    """XML-style calls of Qwen3-Coder, Qwen3.5 and Nemotron-3 (parameters typed by the schema)."""

    name = "qwen3_coder"
    markers = (OPEN,)

    def match_call(self, text: str, start: int, final: bool) -> CallMatch:
        close = text.find(CLOSE, start + len(OPEN))
        if close < 0:
            return CallMatch("invalid", len(text)) if final else CallMatch("incomplete")
        end = close + len(CLOSE)
        body = text[start + len(OPEN):close]
        functions = list(_FUNCTION.finditer(body))
        if not functions or _FUNCTION.sub("", body).strip():
            return CallMatch("invalid", end)
        calls = []
        for function in functions:
            name = function.group(1).strip()
            properties = self.tools.get(name, {}).get("properties", {})
            arguments = {}
            for parameter in _PARAMETER.finditer(function.group(2)):
                key = parameter.group(1).strip()
                arguments[key] = convert_value(_trim(parameter.group(2)), properties.get(key))
            calls.append((name, json.dumps(arguments, ensure_ascii=False), None))
        return CallMatch("complete", end, calls)
