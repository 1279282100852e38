"""Shaping one choice's generated text into reasoning, content and tool calls.

An :class:`OutputShaper` wraps the request's :class:`~atlas_core.parsers.OutputParser`
(reasoning parser first, then the tool-call parser on the answer). Each API renders what it
yields: :func:`ordered_parts` gives one ``feed``'s pieces in output order (reasoning, then
content, then the calls), which is how the Anthropic and Responses APIs lay out their blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from atlas_core.parsers import OutputParser, ParserEvents, ToolCall
from atlas_core.parsers.markup_scrub import MarkupScrubber


@dataclass
class ParsePlan:
    """How one request's output is taken apart.

    Attributes:
        tool_parser: a ``ToolParser`` class, or None (tools not offered, or no parser).
        tools: the offered tools (OpenAI chat shape), read by parsers that type arguments.
        reasoning_parser: a ``ReasoningParser`` class, or None.
        in_reasoning: the prompt opened the think block (output starts inside it).
        parallel_tool_calls: keep every call; when false only the first is kept.
        scrub_markup: remove leaked tool-call markup from the content
            (:mod:`atlas_core.parsers.markup_scrub`).
    """

    tool_parser: type | None = None
    tools: list[dict] | None = None
    reasoning_parser: type | None = None
    in_reasoning: bool = False
    parallel_tool_calls: bool = True
    scrub_markup: bool = False


@dataclass
class OutputShaper:
    """Incremental splitter of one choice; it also keeps the whole result.

    Attributes:
        reasoning, content: all text of each kind so far.
        tool_calls: the calls so far (a streaming call's ``arguments`` grow as it goes).
    """

    plan: ParsePlan
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __post_init__(self) -> None:
        plan = self.plan
        reasoning = (plan.reasoning_parser(in_reasoning=plan.in_reasoning)
                     if plan.reasoning_parser else None)
        tools = plan.tool_parser(plan.tools) if plan.tool_parser else None
        self._parser = OutputParser(reasoning, tools) if reasoning or tools else None
        self._calls: dict[int, ToolCall] = {}
        self._scrubber = MarkupScrubber() if plan.scrub_markup else None

    def feed(self, text: str) -> ParserEvents:
        """The pieces of ``text`` that are certain now."""
        if self._parser is None:
            return self._keep(ParserEvents(content=text))
        return self._keep(self._parser.feed(text))

    def finish(self) -> ParserEvents:
        """End of output: whatever was held back (an unfinished call comes back as content)."""
        if self._parser is None and self._scrubber is None:
            return ParserEvents()
        events = self._parser.finish() if self._parser is not None else ParserEvents()
        return self._keep(events, final=True)

    def feed_all(self, text: str) -> ParserEvents:
        """``feed(text)`` then ``finish()`` merged (a whole non-streamed output)."""
        events = self.feed(text)
        tail = self.finish()
        return ParserEvents(events.content + tail.content, events.reasoning + tail.reasoning,
                            events.tool_calls + tail.tool_calls)

    def _keep(self, events: ParserEvents, final: bool = False) -> ParserEvents:
        if self._scrubber is not None:
            events.content = self._scrubber.feed(events.content) + (
                self._scrubber.finish() if final else "")
        if not self.plan.parallel_tool_calls:
            events.tool_calls = [d for d in events.tool_calls if d.index == 0]
        self.reasoning += events.reasoning
        self.content += events.content
        for d in events.tool_calls:
            if d.name is not None:
                self._calls[d.index] = ToolCall(d.id or "", d.name, "")
                self.tool_calls.append(self._calls[d.index])
            if d.index in self._calls:
                self._calls[d.index].arguments += d.arguments
        return events

    def finish_reason(self, raw: str | None) -> str | None:
        """OpenAI ``finish_reason``: ``tool_calls`` when the model stopped after calling tools."""
        return "tool_calls" if raw == "stop" and self.tool_calls else raw


def ordered_parts(events: ParserEvents) -> list[tuple[str, Any]]:
    """``[("reasoning", text), ("content", text), ("tool_call", ToolCallDelta), ...]``.

    A call's deltas come in order: the one with ``name`` starts it, then argument pieces, then
    the one with ``done`` (one delta may do several of these)."""
    parts: list[tuple[str, Any]] = []
    if events.reasoning:
        parts.append(("reasoning", events.reasoning))
    if events.content:
        parts.append(("content", events.content))
    parts.extend(("tool_call", call) for call in events.tool_calls)
    return parts
