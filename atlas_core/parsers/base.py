"""Tool-call parser contract and the streaming scanner every format shares.

A format says where a call may start (`ToolParser.find_start`) and how far a call that starts
there reaches (`ToolParser.match_call`). The scanner does the rest, the same way for streamed
and whole outputs, so feeding any chunking of a text and then `finish` gives exactly what
`parse` gives for the whole text:

- a call is announced only once it is complete and valid (its closing markup arrived, its JSON
  parsed), so no call is ever retracted; its arguments arrive as one delta;
- text that might still turn into a call (a partial marker such as ``"<tool_c"``, an unclosed
  call) is held back, so markup of a valid call never reaches the content;
- a malformed or truncated call is given back verbatim as content; nothing raises;
- whitespace between content and a call, and between calls, is dropped.
"""

from __future__ import annotations

import copy
import json
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class ToolCall:
    """One parsed call: ``arguments`` is a JSON text (OpenAI's ``function.arguments``)."""

    id: str
    name: str
    arguments: str


@dataclass
class ToolCallDelta:
    """A streamed piece of call ``index``: ``id`` and ``name`` are set on the delta that starts it."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class ParserEvents:
    """What one `feed` / `finish` produced: content and reasoning text deltas, tool-call deltas."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


@dataclass
class ParsedOutput:
    """A whole output taken apart: content, reasoning (None when there was none) and calls."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str | None = None


@dataclass
class CallMatch:
    """How a call starting at some index turned out.

    ``status`` is ``"complete"`` (``calls`` parsed, text consumed up to ``end``),
    ``"incomplete"`` (more text is needed) or ``"invalid"`` (``text[start:end]`` is content).
    """

    status: str
    end: int = 0
    calls: list[tuple[str, str, str | None]] = field(default_factory=list)  # (name, arguments, id)


def arguments_json(value: Any) -> str:
    """Arguments as JSON text: strings are taken as already-encoded JSON, None as ``{}``."""
    if value is None:
        return "{}"
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def random_call_id() -> str:
    """An OpenAI-style call id, ``call_`` and 24 hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


def _marker_prefix_len(text: str, markers: tuple[str, ...]) -> int:
    best = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:size]):
                best = size
                break
    return best


class ToolParser(ABC):
    """Base of every tool-call format. Create one per request.

    Args:
        tools: the request's tools (OpenAI ``{"type": "function", "function": {...}}`` or bare
            schemas); formats that convert argument types read their JSON schemas.
        make_id: builds call ids when the model gives none (default `random_call_id`).

    Class attributes:
        name: registry name.
        markers: texts that open a call. Where they are special tokens of the model (e.g.
            ``<|python_tag|>``, ``[TOOL_CALLS]``), decode with ``skip_special_tokens=False``.
    """

    name = ""
    markers: tuple[str, ...] = ()

    def __init__(self, tools: list[dict] | None = None, *, make_id: Callable[[], str] | None = None) -> None:
        self.tools = {}
        for tool in tools or ():
            spec = tool.get("function", tool) if isinstance(tool, dict) else None
            if isinstance(spec, dict) and isinstance(spec.get("name"), str):
                self.tools[spec["name"]] = spec.get("parameters") or {}
        self.make_id = make_id or random_call_id
        self._buffer = ""
        self._after_call = False
        self._started = False
        self._num_calls = 0

    def find_start(self, text: str, pos: int, at_output_start: bool) -> int | None:
        """Index of the first possible call start in ``text[pos:]``, or None."""
        found = [i for i in (text.find(m, pos) for m in self.markers) if i >= 0]
        return min(found) if found else None

    @abstractmethod
    def match_call(self, text: str, start: int, final: bool) -> CallMatch:
        """Resolve the call that starts at ``text[start]``; ``final`` means no more text comes.

        Must return ``end > start`` for complete and invalid matches, and never
        ``"incomplete"`` when ``final``.
        """

    def feed(self, delta: str) -> ParserEvents:
        """Take the next piece of generated text; return what is now certain."""
        self._buffer += delta
        return self._scan(final=False)

    def finish(self) -> ParserEvents:
        """End of output: resolve everything still held back (unfinished calls become content)."""
        return self._scan(final=True)

    def parse(self, text: str) -> ParsedOutput:
        """Parse a whole output (this parser's streaming state is not touched)."""
        parser = copy.copy(self)
        parser._buffer, parser._after_call, parser._started, parser._num_calls = text, False, False, 0
        events = parser._scan(final=True)
        calls = [ToolCall(d.id or "", d.name or "", d.arguments) for d in events.tool_calls]
        return ParsedOutput(content=events.content, tool_calls=calls)

    def _content(self, events: ParserEvents, text: str) -> None:
        if self._after_call:
            text = text.lstrip()
        if text:
            events.content += text
            self._after_call, self._started = False, True

    def _scan(self, final: bool) -> ParserEvents:
        events, text, pos = ParserEvents(), self._buffer, 0
        while True:
            start = self.find_start(text, pos, not self._started)
            if start is None:
                stop = len(text)
                if not final:
                    stop -= _marker_prefix_len(text[pos:], self.markers)
                    stop = pos + len(text[pos:stop].rstrip())
                self._content(events, text[pos:stop])
                break
            match = self.match_call(text, start, final)
            if match.status == "incomplete" and final:
                match = CallMatch("invalid", len(text))
            if match.status == "incomplete":
                stop = pos + len(text[pos:start].rstrip())
                self._content(events, text[pos:stop])
                break
            if match.status == "invalid":
                self._content(events, text[pos:match.end])
                pos = match.end
                continue
            self._content(events, text[pos:start].rstrip())
            for name, arguments, call_id in match.calls:
                events.tool_calls.append(ToolCallDelta(self._num_calls, call_id or self.make_id(), name, arguments))
                self._num_calls += 1
            self._after_call, self._started, pos = True, True, match.end
        self._buffer = text[stop:]
        return events
