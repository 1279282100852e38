"""Llama 3.1+ JSON tool calls: ``{"name": ..., "parameters": {...}}`` as the whole reply, or after
``<|python_tag|>``; several calls may be separated by ``;``."""

from __future__ import annotations

import json

from atlas_core.parsers.base import CallHead, CallMatch, ToolParser
from atlas_core.parsers.hermes import call_from_json
from atlas_core.parsers.json_calls import json_call_head, skip_space

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


class Llama3JsonToolParser(ToolParser):
    """JSON calls of Llama 3.x. A reply that starts with ``{`` is tried as calls; anything else is
    content. ``<|python_tag|>`` is a special token: decode with ``skip_special_tokens=False``."""

    name = "llama3_json"
    markers = (PYTHON_TAG,)

    def find_start(self, text: str, pos: int, at_output_start: bool) -> int | None:
        tagged = super().find_start(text, pos, at_output_start)
        if at_output_start:
            brace = skip_space(text, pos)
            if brace < len(text) and text[brace] == "{" and (tagged is None or brace < tagged):
                return brace
        return tagged

    def match_head(self, text: str, start: int, final: bool, continued: bool = False) -> CallHead:
        tagged = not continued and text.startswith(PYTHON_TAG, start)
        pos = skip_space(text, start + len(PYTHON_TAG) if tagged else start)
        if pos == len(text):
            return CallHead("none" if final else "incomplete")
        return json_call_head(text, pos, final) if text[pos] == "{" else CallHead("none")

    def match_tail(self, text: str, pos: int, final: bool, head: CallHead) -> CallMatch:
        after = skip_space(text, pos)
        if after == len(text) and not final:
            return CallMatch("incomplete")
        if after < len(text) and text[after] == ";":
            return CallMatch("complete", after + 1, more=True)
        return CallMatch("complete", pos)

    def match_call(self, text: str, start: int, final: bool) -> CallMatch:
        pos = start + len(PYTHON_TAG) if text.startswith(PYTHON_TAG, start) else start
        calls = []
        while True:
            pos = skip_space(text, pos)
            try:
                value, end = _DECODER.raw_decode(text, pos)
            except ValueError:
                return CallMatch("invalid", len(text)) if final else CallMatch("incomplete")
            call = call_from_json(value)
            if call is None:
                return CallMatch("invalid", end)
            calls.append(call)
            pos = skip_space(text, end)
            if pos == len(text) and not final:
                return CallMatch("incomplete")
            if pos < len(text) and text[pos] == ";":
                pos += 1
                if skip_space(text, pos) == len(text) and final:
                    return CallMatch("complete", len(text), calls)
                continue
            return CallMatch("complete", end, calls)
