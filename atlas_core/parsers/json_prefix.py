"""`JsonPrefix`: how far a streamed text stays a valid beginning of one JSON value.

Clients that parse streamed tool arguments as they arrive (the Anthropic SDK parses every
``input_json_delta`` in partial mode) fail on text that can no longer become valid JSON; an API
layer with that constraint passes on only the valid part of a malformed call's arguments.
"""

from __future__ import annotations

import re

_ESCAPES = set('"\\/bfnrtu')
_HEX = set("0123456789abcdefABCDEF")
_LITERALS = {"t": "true", "f": "false", "n": "null"}
_NUMBER_CHARS = set("0123456789+-.eE")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NUMBER_START = re.compile(r"-?(?:(?:0|[1-9]\d*)(?:\.\d*|(?:\.\d+)?[eE][+-]?\d*)?)?")


class JsonPrefix:
    """Checks, piece by piece, that a text is a prefix of one JSON value (then whitespace).

    Attributes:
        is_valid: every character so far kept the text a valid prefix.
        is_complete: the value is whole (only whitespace may follow).
    """

    def __init__(self) -> None:
        self.is_valid, self.is_complete = True, False
        self._stack: list[str] = []     # "{" / "[" of the open containers
        self._expect = "value"          # value, value_or_end, key, key_or_end, colon, after
        self._string: str | None = None  # "key" / "value" inside a string
        self._escape = 0                # -1 after a backslash, n hex digits still due
        self._token = ""                # an unfinished number or literal

    def feed(self, text: str) -> int:
        """Take ``text``; return how many of its first characters keep the prefix valid
        (``len(text)`` while valid, 0 for everything after the first invalid character)."""
        if not self.is_valid:
            return 0
        for i, char in enumerate(text):
            if not self._step(char):
                self.is_valid = False
                return i
        return len(text)

    def _end_value(self) -> None:
        self._expect, self._token = "after", ""
        self.is_complete = not self._stack

    def _step(self, char: str) -> bool:
        if self._string:
            return self._string_char(char)
        token = self._token
        if token and token[0] in _LITERALS:
            word = _LITERALS[token[0]]
            if not word.startswith(token + char):
                return False
            self._token += char
            if self._token == word:
                self._end_value()
            return True
        if token:
            if char in _NUMBER_CHARS:
                self._token += char
                return _NUMBER_START.fullmatch(self._token) is not None
            if _NUMBER.fullmatch(token) is None:
                return False
            self._end_value()
        return char.isspace() or self._structural(char)

    def _string_char(self, char: str) -> bool:
        if self._escape == -1:
            self._escape = 4 if char == "u" else 0
            return char in _ESCAPES
        if self._escape:
            self._escape -= 1
            return char in _HEX
        if char == "\\":
            self._escape = -1
        elif char == '"':
            if self._string == "key":
                self._expect = "colon"
            else:
                self._end_value()
            self._string = None
        return ord(char) >= 0x20

    def _structural(self, char: str) -> bool:
        expect = self._expect
        if expect == "value_or_end" and char == "]":
            return self._close("[")
        if expect in ("value", "value_or_end"):
            return self._start_value(char)
        if expect == "key_or_end" and char == "}":
            return self._close("{")
        if expect in ("key", "key_or_end"):
            self._string = "key" if char == '"' else None
            return char == '"'
        if expect == "colon":
            self._expect = "value"
            return char == ":"
        if expect == "after" and self._stack:
            if char == ",":
                self._expect = "key" if self._stack[-1] == "{" else "value"
                return True
            return self._close({"}": "{", "]": "["}.get(char, ""))
        return False

    def _start_value(self, char: str) -> bool:
        if char in "{[":
            self._stack.append(char)
            self._expect = "key_or_end" if char == "{" else "value_or_end"
        elif char == '"':
            self._string = "value"
        elif char in _LITERALS or char == "-" or char.isdigit():
            self._token = char
        else:
            return False
        return True

    def _close(self, opener: str) -> bool:
        if not self._stack or self._stack[-1] != opener:
            return False
        self._stack.pop()
        self._end_value()
        return True
