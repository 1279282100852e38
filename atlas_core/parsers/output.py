"""`OutputParser`: reasoning first, then tool calls on the content that remains."""

from __future__ import annotations

from atlas_core.parsers.base import ToolParser
from atlas_core.parsers.events import ParsedOutput, ParserEvents
from atlas_core.parsers.reasoning import ReasoningParser


class OutputParser:
    """Chains an optional `ReasoningParser` and an optional `ToolParser` for one request.

    Calls inside reasoning stay reasoning; only the answer is searched for calls.
    """

    def __init__(self, reasoning: ReasoningParser | None = None, tools: ToolParser | None = None) -> None:
        self.reasoning, self.tools = reasoning, tools

    def _tool_pass(self, events: ParserEvents, final: bool) -> ParserEvents:
        if self.tools is None:
            return events
        found = self.tools.feed(events.content)
        if final:
            tail = self.tools.finish()
            found.content += tail.content
            found.tool_calls += tail.tool_calls
        return ParserEvents(found.content, events.reasoning, found.tool_calls)

    def feed(self, delta: str) -> ParserEvents:
        """Take the next piece of generated text."""
        events = self.reasoning.feed(delta) if self.reasoning else ParserEvents(content=delta)
        return self._tool_pass(events, final=False)

    def finish(self) -> ParserEvents:
        """End of output."""
        events = self.reasoning.finish() if self.reasoning else ParserEvents()
        return self._tool_pass(events, final=True)

    def parse(self, text: str) -> ParsedOutput:
        """Take a whole output apart."""
        out = self.reasoning.parse(text) if self.reasoning else ParsedOutput(content=text)
        if self.tools is not None:
            calls = self.tools.parse(out.content)
            out.content, out.tool_calls = calls.content, calls.tool_calls
        return out
