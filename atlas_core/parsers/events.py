"""What parsers hand back: parsed calls, streamed call pieces, and per-step and whole-output
results (shared by the tool-call and reasoning parsers)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ToolCall:
    """One parsed call: ``arguments`` is a JSON text (OpenAI's ``function.arguments``)."""

    id: str
    name: str
    arguments: str


@dataclass
class ToolCallDelta:
    """A streamed piece of call ``index``.

    ``id`` and ``name`` are set on the delta that starts the call, ``arguments`` is the next
    piece of its arguments text (often empty on the first delta), ``done`` is set on the delta
    that ends it. One delta may do all three (a call that could not stream).
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    done: bool = False


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
