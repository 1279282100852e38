"""Tool-call parser contract and the streaming scanner every format shares.

A format says where a call may start (`ToolParser.find_start`), how a call that starts there
begins (`ToolParser.match_head`: its name, then a stream of its arguments), what markup closes
it (`ToolParser.match_tail`), and how far a call that cannot stream reaches
(`ToolParser.match_call`). The scanner does the rest, the same way for streamed and whole
outputs, so feeding any chunking of a text and then `finish` gives exactly what `parse` gives for
the whole text:

- a call starts as soon as its name is known and its arguments open (a `ToolCallDelta` with
  ``id`` and ``name``), its arguments text follows in pieces as the model writes it, and a delta
  with ``done`` ends it; the pieces concatenate to the final ``arguments``;
- once started, a call is never retracted: cut short, it ends with what was generated;
  malformed (e.g. arguments that are not valid JSON), it ends with the raw text of its
  arguments; the rest of its markup is dropped;
- text that might still turn into a call (a partial marker such as ``"<tool_c"``, a call whose
  name is not known yet) is held back, so markup never reaches the content;
- text that turns out not to be a call (and a call cut off before its name and arguments began)
  is given back verbatim as content; nothing raises;
- whitespace between content and a call, and between calls, is dropped.
"""

from __future__ import annotations

import copy
import json
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

from atlas_core.parsers.events import ParsedOutput, ParserEvents, ToolCall, ToolCallDelta


@dataclass
class CallMatch:
    """How a call starting at some index turned out.

    ``status`` is ``"complete"`` (``calls`` parsed, text consumed up to ``end``),
    ``"incomplete"`` (more text is needed) or ``"invalid"`` (``text[start:end]`` is content).
    From `ToolParser.match_tail`, ``more`` says another call of the same group may begin at
    ``end`` without a marker (e.g. after ``,`` in a JSON list of calls).
    """

    status: str
    end: int = 0
    calls: list[tuple[str, str, str | None]] = field(default_factory=list)  # (name, arguments, id)
    more: bool = False


@dataclass
class CallHead:
    """How a call starting at some index begins (`ToolParser.match_head`).

    ``status`` is ``"stream"`` (the name is known; ``arguments`` streams the arguments from
    ``body`` on), ``"incomplete"`` (more text is needed to tell) or ``"none"`` (not a call that
    can stream; `ToolParser.match_call` decides). ``arguments`` has
    ``advance(text, pos, final) -> (piece, new pos, ended)``; ``tail`` is the format's own
    note for `ToolParser.match_tail`.
    """

    status: str
    name: str = ""
    call_id: str | None = None
    body: int = 0
    arguments: Any = None
    tail: Any = None


@dataclass
class OpenCall:
    """A call whose arguments (``phase == "arguments"``) or closing markup is still coming."""

    index: int
    head: CallHead
    phase: str = "arguments"


def arguments_json(value: Any) -> str:
    """Arguments as JSON text: strings are taken as already-encoded JSON, None as ``{}``."""
    if value is None:
        return "{}"
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def through_close_tag(text: str, pos: int, close: str, final: bool) -> CallMatch:
    """End a streamed call at the next ``close`` tag after ``pos`` (dropping what lies between);
    with no tag yet the call is incomplete, or complete at the end of the text when ``final``."""
    end = text.find(close, pos)
    if end >= 0:
        return CallMatch("complete", end + len(close))
    return CallMatch("complete", len(text)) if final else CallMatch("incomplete")


def random_call_id() -> str:
    """An OpenAI-style call id, ``call_`` and 24 hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


def marker_prefix_len(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that is a proper prefix of one of ``markers``."""
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
        self._reset()

    def _reset(self) -> None:
        self._buffer = ""
        self._after_call = self._started = self._continued = False
        self._num_calls = 0
        self._call: OpenCall | None = None

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

    def match_head(self, text: str, start: int, final: bool, continued: bool = False) -> CallHead:
        """Optional. How the call at ``text[start]`` begins, so that its arguments can stream.

        ``continued`` means ``start`` follows a call whose tail said ``more`` (no marker there).
        The default streams nothing: every call goes through `match_call`. Must not return
        ``"incomplete"`` when ``final``.
        """
        return CallHead("none")

    def match_tail(self, text: str, pos: int, final: bool, head: CallHead) -> CallMatch:
        """Optional. The closing markup of a streamed call whose arguments ended at ``pos``:
        ``"complete"`` up to ``end`` (``more`` when another call may follow at once) or
        ``"incomplete"``. Never ``"incomplete"`` when ``final``. Default: nothing to close."""
        return CallMatch("complete", pos)

    def feed(self, delta: str) -> ParserEvents:
        """Take the next piece of generated text; return what is now certain."""
        self._buffer += delta
        return self._scan(final=False)

    def finish(self) -> ParserEvents:
        """End of output: resolve everything still held back (an open call ends with what it has;
        text that never became a call is content)."""
        return self._scan(final=True)

    def parse(self, text: str) -> ParsedOutput:
        """Parse a whole output (this parser's streaming state is not touched)."""
        parser = copy.copy(self)
        parser._reset()
        parser._buffer = text
        events = parser._scan(final=True)
        calls: dict[int, ToolCall] = {}
        for d in events.tool_calls:
            if d.name is not None:
                calls[d.index] = ToolCall(d.id or "", d.name, "")
            calls[d.index].arguments += d.arguments
        return ParsedOutput(content=events.content, tool_calls=list(calls.values()))

    def _content(self, events: ParserEvents, text: str) -> None:
        if self._after_call:
            text = text.lstrip()
        if text:
            events.content += text
            self._after_call, self._started = False, True

    def _open(self, events: ParserEvents, head: CallHead) -> int:
        index = self._num_calls
        self._num_calls += 1
        events.tool_calls.append(ToolCallDelta(index, head.call_id or self.make_id(), head.name))
        self._call, self._started = OpenCall(index, head), True
        return head.body

    def _advance(self, events: ParserEvents, text: str, pos: int, final: bool) -> tuple[int, bool]:
        """Move the open call on: ``(new pos, whether it ended)``."""
        call = self._call
        if call.phase == "arguments":
            piece, pos, ended = call.head.arguments.advance(text, pos, final)
            if piece:
                events.tool_calls.append(ToolCallDelta(call.index, arguments=piece))
            if not ended:
                return pos, False
            call.phase = "tail"
        tail = self.match_tail(text, pos, final, call.head)
        if tail.status == "incomplete":
            return pos, False
        events.tool_calls.append(ToolCallDelta(call.index, done=True))
        self._call, self._after_call, self._continued = None, True, tail.more
        return tail.end, True

    def _scan(self, final: bool) -> ParserEvents:
        events, text, pos = ParserEvents(), self._buffer, 0
        while True:
            if self._call is not None:
                pos, ended = self._advance(events, text, pos, final)
                if not ended:
                    break
                continue
            if self._continued:
                head = self.match_head(text, pos, final, continued=True)
                if head.status == "incomplete":
                    break
                self._continued = False
                if head.status == "stream":
                    pos = self._open(events, head)
                continue
            start = self.find_start(text, pos, not self._started)
            if start is None:
                stop = len(text)
                if not final:
                    stop -= marker_prefix_len(text[pos:], self.markers)
                    stop = pos + len(text[pos:stop].rstrip())
                self._content(events, text[pos:stop])
                pos = stop
                break
            head = self.match_head(text, start, final)
            if head.status == "none":
                end = self._whole_call(events, text, pos, start, final)
                if end is None:
                    pos = self._hold(events, text, pos, start)
                    break
                pos = end
                continue
            if head.status == "incomplete":
                pos = self._hold(events, text, pos, start)
                break
            self._content(events, text[pos:start].rstrip())
            pos = self._open(events, head)
        self._buffer = text[pos:]
        return events

    def _hold(self, events: ParserEvents, text: str, pos: int, start: int) -> int:
        """Emit the content before a call that may start at ``start``; keep the rest."""
        stop = pos + len(text[pos:start].rstrip())
        self._content(events, text[pos:stop])
        return stop

    def _whole_call(self, events: ParserEvents, text: str, pos: int, start: int,
                    final: bool) -> int | None:
        """Resolve a call that cannot stream; None when more text is needed."""
        match = self.match_call(text, start, final)
        if match.status == "incomplete" and final:
            match = CallMatch("invalid", len(text))
        if match.status == "incomplete":
            return None
        if match.status == "invalid":
            self._content(events, text[pos:match.end])
            return match.end
        self._content(events, text[pos:start].rstrip())
        for name, arguments, call_id in match.calls:
            call_id = call_id or self.make_id()
            events.tool_calls.append(ToolCallDelta(self._num_calls, call_id, name, arguments, True))
            self._num_calls += 1
        self._after_call, self._started = True, True
        return match.end
