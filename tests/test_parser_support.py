"""Streaming helpers for the per-format tool-parser tests: feed a text to a parser in chunks and
gather what came out, to compare with parsing the whole text at once.

No tests here; imported by tests/test_parser_*.py.
"""

from __future__ import annotations

import random

from atlas_core.parsers import ParserEvents


def feed_in_chunks(parser, text: str, rng: random.Random | None,
                   largest: int = 9) -> list[ParserEvents]:
    """The events of feeding ``text`` to ``parser`` in chunks of 1 character (``rng`` None) or
    of ``rng.randint(1, largest)`` characters, then of ``finish``."""
    events, pos = [], 0
    while pos < len(text):
        size = 1 if rng is None else rng.randint(1, largest)
        events.append(parser.feed(text[pos:pos + size]))
        pos += size
    events.append(parser.finish())
    return events


def streamed(parser, text: str, rng: random.Random | None, *, pieces: bool = False):
    """``(content, [(name, arguments)])`` of ``text`` fed to ``parser`` by `feed_in_chunks`;
    with ``pieces``, ``(name, arguments, pieces)`` where ``pieces`` counts the non-empty
    argument deltas of the call."""
    content, calls = "", {}
    for event in feed_in_chunks(parser, text, rng):
        content += event.content
        for d in event.tool_calls:
            if d.name is not None:
                calls[d.index] = [d.name, "", 0]
            calls[d.index][1] += d.arguments
            calls[d.index][2] += bool(d.arguments)
    return content, [tuple(c) if pieces else tuple(c[:2]) for c in calls.values()]
