"""Reasoning parser: splits ``<think>...</think>`` from the answer, streamed or whole."""

from __future__ import annotations

from atlas_core.parsers.events import ParsedOutput, ParserEvents


def prompt_opens_reasoning(prompt: str, start: str = "<think>", end: str = "</think>") -> bool:
    """True when the rendered prompt leaves a reasoning block open (e.g. Qwen3.5 and
    Nemotron-3 templates end the generation prompt with ``<think>``), so output starts inside it."""
    return prompt.rfind(start) > prompt.rfind(end)


def _partial_suffix(text: str, tag: str) -> int:
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


class ReasoningParser:
    """Separates reasoning from content. Create one per request.

    A block counts when the output opens with ``start`` (after whitespace), or from the first
    character when ``in_reasoning`` (the prompt already opened it, see `prompt_opens_reasoning`).
    Reasoning and the content after the block are stripped of surrounding whitespace; tags never
    reach either. An unclosed block (output cut short) is all reasoning.
    """

    name = "think"

    def __init__(self, *, in_reasoning: bool = False, start: str = "<think>", end: str = "</think>") -> None:
        self.start, self.end, self._in_reasoning = start, end, in_reasoning
        self._reset()

    def _reset(self) -> None:
        self._mode = "reasoning" if self._in_reasoning else "start"
        self._buffer = ""
        self._reasoning_seen = self._in_reasoning
        self._reasoning_begun = False

    def feed(self, delta: str) -> ParserEvents:
        """Take the next piece of text; return the reasoning and content that are now certain."""
        self._buffer += delta
        return self._scan(final=False)

    def finish(self) -> ParserEvents:
        """End of output: release what was held back."""
        return self._scan(final=True)

    def parse(self, text: str) -> ParsedOutput:
        """Split a whole output; ``reasoning`` is None when it had no reasoning block."""
        parser = ReasoningParser(in_reasoning=self._in_reasoning, start=self.start, end=self.end)
        events = parser.feed(text)
        tail = parser.finish()
        reasoning = events.reasoning + tail.reasoning if parser._reasoning_seen else None
        return ParsedOutput(content=events.content + tail.content, reasoning=reasoning)

    def _scan(self, final: bool) -> ParserEvents:
        events = ParserEvents()
        if self._mode == "start":
            head = self._buffer.lstrip()
            if head.startswith(self.start):
                self._buffer = head[len(self.start):]
                self._mode, self._reasoning_seen = "reasoning", True
            elif final or not self.start.startswith(head):
                self._mode = "content"
            else:
                return events
        if self._mode == "reasoning":
            self._scan_reasoning(events, final)
        if self._mode in ("content", "after"):
            text = self._buffer.lstrip() if self._mode == "after" else self._buffer
            if text:
                events.content, self._mode = text, "content"
            self._buffer = ""
        return events

    def _scan_reasoning(self, events: ParserEvents, final: bool) -> None:
        close = self._buffer.find(self.end)
        text = self._buffer if close < 0 else self._buffer[:close]
        if not self._reasoning_begun:
            text = text.lstrip()
        if close >= 0 or final:
            emit, rest = text.rstrip(), ""
        else:
            keep = _partial_suffix(text, self.end)
            emit = text[:len(text) - keep].rstrip()
            rest = text[len(emit):]
        if emit:
            events.reasoning, self._reasoning_begun = emit, True
        if close >= 0:
            self._buffer, self._mode = self._buffer[close + len(self.end):], "after"
        else:
            self._buffer = rest
