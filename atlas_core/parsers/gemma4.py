"""Gemma-4 tool calls and thinking channel.

Calls: ``<|tool_call>call:NAME{key:value,...}<tool_call|>``, one marker pair per call, with the
argument syntax of the Gemma-4 chat template (its ``format_argument`` macro): strings inside
``<|"|>`` quotes, bare keys, ``true``/``false``, numbers, ``[...]`` lists and ``{...}`` maps.
Reasoning: ``<|channel>thought ... <channel|>``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from atlas_core.parsers.base import CallMatch, ToolParser, arguments_json
from atlas_core.parsers.reasoning import ReasoningParser

OPEN, CLOSE = "<|tool_call>", "<tool_call|>"
QUOTE = '<|"|>'
_NAME = re.compile(r"call:([\w.\-]+)\{")
_BARE_END = re.compile(r"[,}\]:]")


class GemmaArgumentError(ValueError):
    """Text that is not in the Gemma-4 argument syntax."""


def _value(text: str, pos: int) -> tuple[Any, int]:
    if text.startswith(QUOTE, pos):
        end = text.find(QUOTE, pos + len(QUOTE))
        if end < 0:
            raise GemmaArgumentError("unterminated string")
        return text[pos + len(QUOTE):end], end + len(QUOTE)
    if text.startswith("{", pos):
        return _mapping(text, pos + 1)
    if text.startswith("[", pos):
        items: list[Any] = []
        pos += 1
        while not text.startswith("]", pos):
            item, pos = _value(text, pos)
            items.append(item)
            if text.startswith(",", pos):
                pos += 1
            elif not text.startswith("]", pos):
                raise GemmaArgumentError(f"expected ',' or ']' at {pos}")
        return items, pos + 1
    match = _BARE_END.search(text, pos)
    end = match.start() if match else len(text)
    word = text[pos:end].strip()
    if not word:
        raise GemmaArgumentError(f"expected a value at {pos}")
    return _scalar(word), end


def _scalar(word: str) -> Any:
    """A bare word: a constant, a JSON number, else (models drop quotes at times) a string."""
    constants = {"true": True, "false": False, "null": None, "None": None}
    if word in constants:
        return constants[word]
    try:
        return json.loads(word)
    except ValueError:
        return word


def _mapping(text: str, pos: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    while not text.startswith("}", pos):
        if text.startswith(QUOTE, pos):
            key, pos = _value(text, pos)
        else:
            colon = text.find(":", pos)
            if colon < 0:
                raise GemmaArgumentError(f"expected 'key:' at {pos}")
            key, pos = text[pos:colon].strip(), colon
        if not text.startswith(":", pos):
            raise GemmaArgumentError(f"expected ':' after key {key!r}")
        out[str(key)], pos = _value(text, pos + 1)
        if text.startswith(",", pos):
            pos += 1
        elif not text.startswith("}", pos):
            raise GemmaArgumentError(f"expected ',' or '}}' at {pos}")
    return out, pos + 1


def parse_gemma_arguments(text: str) -> dict[str, Any]:
    """The arguments map ``{key:value,...}`` (the whole ``text``) as a dict.

    Raises:
        GemmaArgumentError: ``text`` is not one map in the Gemma-4 argument syntax.
    """
    if not text.startswith("{"):
        raise GemmaArgumentError("arguments must start with '{'")
    value, end = _mapping(text, 1)
    if text[end:].strip():
        raise GemmaArgumentError(f"unexpected text after the arguments: {text[end:]!r}")
    return value


class Gemma4ToolParser(ToolParser):
    """Gemma-4 calls: ``<|tool_call>call:NAME{...}<tool_call|>`` (arguments converted to JSON)."""

    name = "gemma4"
    markers = (OPEN,)

    def match_call(self, text: str, start: int, final: bool) -> CallMatch:
        close = text.find(CLOSE, start + len(OPEN))
        if close < 0:
            return CallMatch("invalid", len(text)) if final else CallMatch("incomplete")
        end = close + len(CLOSE)
        body = text[start + len(OPEN):close].strip()
        head = _NAME.match(body)
        if head is None:
            return CallMatch("invalid", end)
        try:
            arguments = parse_gemma_arguments(body[head.end() - 1:])
        except GemmaArgumentError:
            return CallMatch("invalid", end)
        return CallMatch("complete", end, [(head.group(1), arguments_json(arguments), None)])


class Gemma4ReasoningParser(ReasoningParser):
    """Gemma-4 thinking: ``<|channel>thought`` ... ``<channel|>`` before the answer."""

    name = "gemma4"

    def __init__(self, *, in_reasoning: bool = False, start: str = "<|channel>thought",
                 end: str = "<channel|>") -> None:
        super().__init__(in_reasoning=in_reasoning, start=start, end=end)
