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


def calls_from_json(value: object) -> list[tuple[str, str, str | None]] | None:
    """The calls of a JSON list of call objects (or of one bare call object), else None when
    the list is empty or any item is not a call (see `call_from_json`)."""
    items = value if isinstance(value, list) else [value]
    calls = [call_from_json(item) for item in items]
    return None if not calls or None in calls else calls


class TaggedJsonToolParser(ToolParser):
    """Calls as JSON inside :attr:`open_tag` ... :attr:`close_tag`. A call that cannot stream is
    read whole: the JSON between the tags, turned into calls by :meth:`calls_from_value`.
    Subclasses give the tags, :meth:`match_head` and, where the JSON holds several calls,
    :meth:`calls_from_value` and :meth:`match_tail`."""

    open_tag, close_tag = OPEN, CLOSE

    def calls_from_value(self, value: object) -> list[tuple[str, str, str | None]] | None:
        """The calls of one block's decoded JSON (default: a single call object), else None."""
        call = call_from_json(value)
        return [call] if call else None

    def match_tail(self, text: str, pos: int, final: bool, head: CallHead) -> CallMatch:
        return through_close_tag(text, pos, self.close_tag, final)

    def match_call(self, text: str, start: int, final: bool) -> CallMatch:
        body = start + len(self.open_tag)
        close = text.find(self.close_tag, body)
        if close < 0:
            return CallMatch("invalid", len(text)) if final else CallMatch("incomplete")
        end = close + len(self.close_tag)
        try:
            calls = self.calls_from_value(json.loads(text[body:close]))
        except ValueError:
            calls = None
        return CallMatch("complete", end, calls) if calls else CallMatch("invalid", end)


class HermesToolParser(TaggedJsonToolParser):
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
