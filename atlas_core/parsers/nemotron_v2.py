"""Nemotron-Nano-v2 tool calls: ``<TOOLCALL>[{"name": ..., "arguments": {...}}, ...]</TOOLCALL>``
(one JSON list of calls per block; the arguments an object or an already-encoded string)."""

from __future__ import annotations

import json

from atlas_core.parsers.base import CallHead, CallMatch, ToolParser, through_close_tag
from atlas_core.parsers.hermes import call_from_json
from atlas_core.parsers.json_calls import json_call_head, skip_space

OPEN, CLOSE = "<TOOLCALL>", "</TOOLCALL>"


class NemotronV2ToolParser(ToolParser):
    """Calls as a JSON list inside ``<TOOLCALL>`` ... ``</TOOLCALL>`` (NVIDIA Nemotron-Nano-v2
    and Nemotron-H chat templates). Each call of the list streams as soon as its name is read."""

    name = "nemotron_v2"
    markers = (OPEN,)

    def match_head(self, text: str, start: int, final: bool, continued: bool = False) -> CallHead:
        short = CallHead("none" if final else "incomplete")
        pos = skip_space(text, start if continued else start + len(OPEN))
        if not continued:
            if pos == len(text):
                return short
            if text[pos] != "[":
                return CallHead("none")
            pos = skip_space(text, pos + 1)
        if pos == len(text):
            return short
        if text[pos] != "{":
            return CallHead("none")
        return json_call_head(text, pos, final, stops=(CLOSE,))

    def match_tail(self, text: str, pos: int, final: bool, head: CallHead) -> CallMatch:
        after = skip_space(text, pos)
        if after == len(text):
            return CallMatch("complete", after) if final else CallMatch("incomplete")
        if text[after] == ",":
            return CallMatch("complete", after + 1, more=True)
        return through_close_tag(text, after, CLOSE, final)

    def match_call(self, text: str, start: int, final: bool) -> CallMatch:
        close = text.find(CLOSE, start + len(OPEN))
        if close < 0:
            return CallMatch("invalid", len(text)) if final else CallMatch("incomplete")
        end = close + len(CLOSE)
        try:
            value = json.loads(text[start + len(OPEN):close])
        except ValueError:
            return CallMatch("invalid", end)
        items = value if isinstance(value, list) else [value]
        calls = [call_from_json(item) for item in items]
        if not calls or None in calls:
            return CallMatch("invalid", end)
        return CallMatch("complete", end, calls)
