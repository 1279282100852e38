"""Streaming JSON calls: the head of a ``{"name": ..., "arguments": {...}}`` object, and its
arguments text as the model writes it.

`json_call_head` reads the object's members in order. Once the name is known and the
``"arguments"`` (or ``"parameters"``) value opens with ``{``, the call can stream: the value's raw
text is then passed on by `JsonArguments` piece by piece. Any other layout (arguments before the
name, arguments given as a JSON string, no arguments) is read whole and passed on at once by
`FixedArguments`.
"""

from __future__ import annotations

import json

from atlas_core.parsers.base import CallHead, marker_prefix_len

_DECODER = json.JSONDecoder()
ARGUMENT_KEYS = ("arguments", "parameters")


def skip_space(text: str, pos: int, end: int | None = None) -> int:
    """First index at or after ``pos`` (before ``end``) that is not whitespace."""
    end = len(text) if end is None else end
    while pos < end and text[pos].isspace():
        pos += 1
    return pos


class FixedArguments:
    """Arguments known whole: passed on in one piece, consuming nothing."""

    def __init__(self, arguments: str) -> None:
        self.arguments = arguments

    def advance(self, text: str, pos: int, final: bool) -> tuple[str, int, bool]:
        return self.arguments, pos, True


class JsonArguments:
    """The raw text of a JSON object value, streamed from its ``{``.

    The value ends where its brackets balance (strings and escapes understood, validity not
    checked), or where one of ``stops`` begins (then trailing whitespace is dropped). With
    ``outer``, the rest of the enclosing call object is then skipped up to its closing ``}``.
    Whitespace is held back until text follows it, so the pieces always concatenate to the
    final arguments.
    """

    def __init__(self, stops: tuple[str, ...] = (), outer: bool = True) -> None:
        self.stops, self.outer = stops, outer
        self.depth, self.in_string, self.escaped = 0, False, False
        self.in_arguments, self._held = True, ""

    def _step(self, char: str) -> None:
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif char == "\\":
                self.escaped = True
            elif char == '"':
                self.in_string = False
        elif char == '"':
            self.in_string = True
        elif char in "{[":
            self.depth += 1
        elif char in "}]":
            self.depth -= 1

    def advance(self, text: str, pos: int, final: bool) -> tuple[str, int, bool]:
        """Consume ``text[pos:]``: ``(arguments piece, new pos, whether the call's JSON ended)``.

        Stops before a stop text (the format's tail reads it); a partial stop text at the end
        waits for more. At ``final`` the call ends, cut short if need be.
        """
        limit = len(text) if final else len(text) - marker_prefix_len(text[pos:], self.stops)
        out, start, i, stopped = "", pos, pos, False
        while i < limit:
            if self.stops and any(text.startswith(s, i) for s in self.stops):
                stopped = True
                break
            self._step(text[i])
            i += 1
            if self.depth == 0 and not self.in_arguments:
                return out, i, True
            if self.depth == 0:
                out, self._held, self.in_arguments = self._held + text[start:i], "", False
                if not self.outer:
                    return out, i, True
                self.depth = 1
        ended = stopped or final
        if self.in_arguments:
            chunk = self._held + text[start:i]
            out = chunk.rstrip()
            self._held = "" if ended else chunk[len(out):]
        return out, i, ended


def _value(text: str, pos: int, end: int, more: bool):
    """``(value, end of value)``; None when it does not decode (or may still grow)."""
    try:
        value, stop = _DECODER.raw_decode(text if end == len(text) else text[:end], pos)
    except ValueError:
        return None
    if more and stop == end:
        return None
    return value, stop


def json_call_head(text: str, start: int, final: bool, *, end: int | None = None,
                   stops: tuple[str, ...] = ()) -> CallHead:
    """How the call object opening at ``text[start]`` (a ``{``) begins.

    Args:
        text, start: the text and the index of the object's ``{``.
        final: no more text comes.
        end: the call's text ends here at the latest (e.g. its closing tag was seen).
        stops: texts that end the call's markup (passed on to `JsonArguments`).

    Returns:
        ``"stream"`` with the name, id and ``body`` (where the arguments value opens),
        ``"stream"`` with `FixedArguments` and ``body`` after the object for a call read whole,
        ``"incomplete"`` when more text is needed, ``"none"`` when this is not a call object.
    """
    end = len(text) if end is None else end
    more = not final and end == len(text)
    short = CallHead("incomplete" if more else "none")
    name = call_id = arguments = None
    pos = skip_space(text, start + 1, end)
    while True:
        if pos >= end:
            return short
        if text[pos] == "}":
            if not name:
                return CallHead("none")
            return CallHead("stream", name, call_id, pos + 1, FixedArguments(arguments or "{}"))
        key = _value(text, pos, end, more)
        if key is None:
            return short
        key, pos = key
        pos = skip_space(text, pos, end)
        if pos >= end:
            return short
        if not isinstance(key, str) or text[pos] != ":":
            return CallHead("none")
        pos = skip_space(text, pos + 1, end)
        if pos >= end:
            return short
        if key in ARGUMENT_KEYS and arguments is None and name and text[pos] == "{":
            return CallHead("stream", name, call_id, pos, JsonArguments(stops))
        value = _value(text, pos, end, more)
        if value is None:
            return short
        value, stop = value
        if key == "name":
            if not isinstance(value, str) or not value:
                return CallHead("none")
            name = value
        elif key == "id" and isinstance(value, str):
            call_id = value
        elif key in ARGUMENT_KEYS and arguments is None:
            if value is not None and not isinstance(value, (dict, str)):
                return CallHead("none")
            arguments = value if isinstance(value, str) else text[pos:stop] if value else "{}"
        pos = skip_space(text, stop, end)
        if pos < end and text[pos] == ",":
            pos = skip_space(text, pos + 1, end)
        elif pos < end and text[pos] != "}":
            return CallHead("none")
