"""Mistral tool calls: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]`` (v3 tokenizers) and
``[TOOL_CALLS]name[ARGS]{...}`` (v11+ tokenizers, e.g. Mistral-Small-3.2; optionally with
``[CALL_ID]id`` before ``[ARGS]``)."""

from __future__ import annotations

import json
import random
import re
import string

from atlas_core.parsers.base import CallHead, CallMatch, ToolParser, arguments_json
from atlas_core.parsers.hermes import calls_from_json
from atlas_core.parsers.json_calls import JsonArguments, json_call_head, skip_space

MARKER, ARGS = "[TOOL_CALLS]", "[ARGS]"
_HEADER = re.compile(r"\s*([A-Za-z0-9_.\-]+)(?:\[CALL_ID\]([A-Za-z0-9]+))?")
_DECODER = json.JSONDecoder()


def mistral_call_id() -> str:
    """A Mistral-style call id: 9 letters and digits (Mistral templates reject other ids)."""
    return "".join(random.choices(string.ascii_letters + string.digits, k=9))


class MistralToolParser(ToolParser):
    """``[TOOL_CALLS]`` calls, JSON-list and ``name[ARGS]{...}`` forms. ``[TOOL_CALLS]`` is a
    control token: decode with ``skip_special_tokens=False``."""

    name = "mistral"
    markers = (MARKER,)

    def __init__(self, tools=None, *, make_id=None) -> None:
        super().__init__(tools, make_id=make_id or mistral_call_id)

    def match_head(self, text: str, start: int, final: bool, continued: bool = False) -> CallHead:
        short = CallHead("none" if final else "incomplete")
        pos = skip_space(text, start if continued else start + len(MARKER))
        listed = continued or pos < len(text) and text[pos] == "["
        if listed and not continued:
            pos = skip_space(text, pos + 1)
        if pos == len(text):
            return short
        if text[pos] == "{":
            head = json_call_head(text, pos, final, stops=(MARKER,))
            head.tail = "list" if listed else "object"
            return head
        return CallHead("none") if listed else self._named_head(text, pos, final)

    def _named_head(self, text: str, pos: int, final: bool) -> CallHead:
        args_at = text.find(ARGS, pos)
        if args_at < 0:
            return CallHead("none" if final else "incomplete")
        header = _HEADER.fullmatch(text, pos, args_at)
        body = skip_space(text, args_at + len(ARGS))
        if header is None or body < len(text) and text[body] != "{":
            return CallHead("none")
        if body == len(text):
            return CallHead("none" if final else "incomplete")
        return CallHead("stream", header.group(1), header.group(2), body,
                        JsonArguments((MARKER,), outer=False), "named")

    def match_tail(self, text: str, pos: int, final: bool, head: CallHead) -> CallMatch:
        if head.tail != "list":
            return CallMatch("complete", pos)
        after = skip_space(text, pos)
        if after == len(text):
            return CallMatch("complete", after) if final else CallMatch("incomplete")
        if text[after] in ",]":
            return CallMatch("complete", after + 1, more=text[after] == ",")
        return CallMatch("complete", pos)

    def match_call(self, text: str, start: int, final: bool) -> CallMatch:
        pos = start + len(MARKER)
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return CallMatch("invalid", len(text)) if final else CallMatch("incomplete")
        if text[pos] in "[{":
            return self._json_form(text, pos, final)
        return self._named_form(text, start, pos, final)

    def _json_form(self, text: str, pos: int, final: bool) -> CallMatch:
        try:
            value, end = _DECODER.raw_decode(text, pos)
        except ValueError:
            return CallMatch("invalid", len(text)) if final else CallMatch("incomplete")
        calls = calls_from_json(value)
        return CallMatch("complete", end, calls) if calls else CallMatch("invalid", end)

    def _named_form(self, text: str, start: int, pos: int, final: bool) -> CallMatch:
        args_at = text.find(ARGS, pos)
        if args_at < 0:
            return CallMatch("invalid", len(text)) if final else CallMatch("incomplete")
        header = _HEADER.fullmatch(text, pos, args_at)
        if header is None:
            return CallMatch("invalid", args_at)
        try:
            value, end = _DECODER.raw_decode(text, args_at + len(ARGS))
        except ValueError:
            return CallMatch("invalid", len(text)) if final else CallMatch("incomplete")
        if not isinstance(value, dict):
            return CallMatch("invalid", end)
        return CallMatch("complete", end, [(header.group(1), arguments_json(value), header.group(2))])
