"""Hermes / Qwen 2.5-3 tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

from __future__ import annotations

import json

from atlas_core.parsers.base import (CallHead, CallMatch, ToolParser, arguments_json,
                                      through_close_tag)
from atlas_core.parsers.json_calls import json_call_head, skip_space

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def call_from_json(obj: object) -> tuple[str, str, str | None] | None:
    """``(name, arguments JSON, id)`` of a ``{"name", "arguments" | "parameters"}`` object, else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get("arguments", obj.get("parameters"))
    if arguments is not None and not isinstance(arguments, (dict, str)):
        return None
    call_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    return obj["name"], arguments_json(arguments), call_id


class HermesToolParser(ToolParser):
    """Calls as one JSON object each inside ``<tool_call>`` ... ``</tool_call>`` (Qwen 2.5 / 3, Hermes)."""

    name = "hermes"
    markers = (OPEN,)

    def match_head(self, text: str, start: int, final: bool, continued: bool = False) -> CallHead:
        close = text.find(CLOSE, start + len(OPEN))
        end = close if close >= 0 else len(text)
        pos = skip_space(text, start + len(OPEN), end)
        if pos == end:
            return CallHead("incomplete" if close < 0 and not final else "none")
        if text[pos] != "{":
            return CallHead("none")
        return json_call_head(text, pos, final, end=end, stops=(CLOSE,))

    def match_tail(self, text: str, pos: int, final: bool, head: CallHead) -> CallMatch:
        return through_close_tag(text, pos, CLOSE, final)

    def match_call(self, text: str, start: int, final: bool) -> CallMatch:
        close = text.find(CLOSE, start + len(OPEN))
        if close < 0:
            return CallMatch("invalid", len(text)) if final else CallMatch("incomplete")
        end = close + len(CLOSE)
        try:
            call = call_from_json(json.loads(text[start + len(OPEN):close]))
        except ValueError:
            call = None
        return CallMatch("complete", end, [call]) if call else CallMatch("invalid", end)
