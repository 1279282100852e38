"""Nemotron-Nano-v2 tool calls: ``<TOOLCALL>[{"name": ..., "arguments": {...}}, ...]</TOOLCALL>``
(one JSON list of calls per block; the arguments an object or an already-encoded string)."""

from __future__ import annotations

from atlas_core.parsers.base import CallHead, CallMatch
from atlas_core.parsers.hermes import TaggedJsonToolParser, calls_from_json
from atlas_core.parsers.json_calls import json_call_head, skip_space

OPEN, CLOSE = "<TOOLCALL>", "</TOOLCALL>"


class NemotronV2ToolParser(TaggedJsonToolParser):
    """Calls as a JSON list inside ``<TOOLCALL>`` ... ``</TOOLCALL>`` (NVIDIA Nemotron-Nano-v2
    and Nemotron-H chat templates). Each call of the list streams as soon as its name is read."""

    name = "nemotron_v2"
    markers = (OPEN,)
    open_tag, close_tag = OPEN, CLOSE

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
        return super().match_tail(text, after, final, head)

    def calls_from_value(self, value: object) -> list[tuple[str, str, str | None]] | None:
        return calls_from_json(value)
