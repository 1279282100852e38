"""Qwen3-Coder / Qwen3.5 / Nemotron-3 XML tool calls.

``<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>``; values
are raw text, converted to the types the tool's JSON schema declares when the tools are known.
"""

from __future__ import annotations

import json
import re
from typing import Any

from atlas_core.parsers.base import CallHead, CallMatch, ToolParser, through_close_tag
from atlas_core.parsers.json_calls import skip_space

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, END_FUNCTION = "<function=", "</function>"
PARAMETER, END_PARAMETER = "<parameter=", "</parameter>"
_NAME = re.compile(r"[^>\n]*")


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


class XmlParameters:
    """The arguments of one ``<function=...>``: a JSON object written out one parameter at a
    time, as each ``<parameter=KEY>VALUE</parameter>`` completes (``{"city": "Paris"``,
    ``, "days": 3``, ... ``}``); values typed by ``properties`` (the tool's schema).

    Other XML call formats subclass it with their own tags (:attr:`parameter`,
    :attr:`end_parameter`, :attr:`end_call`, :attr:`close`) and parameter-name syntax
    (:meth:`_key`)."""

    parameter, end_parameter, end_call, close = PARAMETER, END_PARAMETER, END_FUNCTION, CLOSE

    def __init__(self, properties: dict) -> None:
        self.properties, self.count = properties, 0
        self._value_ends = (self.end_parameter, self.parameter, self.end_call, self.close)
        self._markup = (self.parameter, self.end_call, self.close)

    def _key(self, raw: str) -> str:
        """The parameter name written between the parameter tag and its ``>``."""
        return raw.strip()

    def _member(self, key: str, value: str) -> str:
        value = convert_value(_trim(value), self.properties.get(key))
        piece = ("{" if self.count == 0 else ", ") + json.dumps(key, ensure_ascii=False)
        self.count += 1
        return f"{piece}: {json.dumps(value, ensure_ascii=False)}"

    def _parameter(self, text: str, pos: int, final: bool) -> tuple[str, int] | None:
        """``(member JSON or "", end)`` of the parameter at ``pos``; None when it needs more."""
        gt = text.find(">", pos)
        if gt < 0:
            return ("", len(text)) if final else None
        key = self._key(text[pos + len(self.parameter):gt])
        if not key or "\n" in key:
            return "", pos + len(self.parameter)
        ends = [(i, len(t) if t == self.end_parameter else 0) for t in self._value_ends
                if (i := text.find(t, gt + 1)) >= 0]
        if not ends:
            return (self._member(key, text[gt + 1:]), len(text)) if final else None
        stop, skip = min(ends)
        return self._member(key, text[gt + 1:stop]), stop + skip

    def advance(self, text: str, pos: int, final: bool) -> tuple[str, int, bool]:
        """Consume ``text[pos:]``: ``(arguments piece, new pos, whether the call ended)``."""
        out = ""
        while True:
            pos = skip_space(text, pos)
            if text.startswith(self.parameter, pos):
                member = self._parameter(text, pos, final)
                if member is None:
                    return out, pos, False
                out, pos = out + member[0], member[1]
                continue
            if text.startswith(self.end_call, pos):
                pos += len(self.end_call)
            elif not text.startswith(self.close, pos) and not (final and pos == len(text)):
                if pos == len(text) or not final and any(
                        t.startswith(text[pos:]) for t in self._markup):
                    return out, pos, False
                nxt = text.find("<", pos + 1)
                pos = len(text) if nxt < 0 else nxt
                continue
            return out + ("}" if self.count else "{}"), pos, True


class XmlToolParser(ToolParser):
    """Calls wrapped in :attr:`open_tag` ... :attr:`close_tag` holding one or more calls that each
    start with :attr:`call_tag` (subclasses give the tags and :meth:`match_head`)."""

    open_tag, close_tag, call_tag = OPEN, CLOSE, FUNCTION

    def match_tail(self, text: str, pos: int, final: bool, head: CallHead) -> CallMatch:
        pos = skip_space(text, pos)
        if text.startswith(self.close_tag, pos):
            return CallMatch("complete", pos + len(self.close_tag))
        if text.startswith(self.call_tag, pos):
            return CallMatch("complete", pos, more=True)
        return through_close_tag(text, pos, self.close_tag, final)

    def match_call(self, text: str, start: int, final: bool) -> CallMatch:
        close = text.find(self.close_tag, start + len(self.open_tag))
        if close < 0:
            return CallMatch("invalid", len(text)) if final else CallMatch("incomplete")
        return CallMatch("invalid", close + len(self.close_tag))


class Qwen3CoderToolParser(XmlToolParser):
    """XML-style calls of Qwen3-Coder, Qwen3.5 and Nemotron-3 (parameters typed by the schema)."""

    name = "qwen3_coder"
    markers = (OPEN,)

    def match_head(self, text: str, start: int, final: bool, continued: bool = False) -> CallHead:
        pos = skip_space(text, start if continued else start + len(OPEN))
        if not text.startswith(FUNCTION, pos):
            partial = not final and FUNCTION.startswith(text[pos:])
            return CallHead("incomplete" if partial else "none")
        name = _NAME.match(text, pos + len(FUNCTION))
        if name.end() == len(text):
            return CallHead("none" if final else "incomplete")
        if text[name.end()] != ">" or not name.group().strip():
            return CallHead("none")
        spec = self.tools.get(name.group().strip(), {})
        return CallHead("stream", name.group().strip(), None, name.end() + 1,
                        XmlParameters(spec.get("properties") or {}))
