"""Keeps tool-call markup that leaked into content away from the client.

A model that half-writes a call (or a parser that gives up on a malformed one) leaves
fragments such as ``<parameter=path>``, ``</function>`` or ``<|tool_call_begin|>`` in the
answer text; clients show them to users or feed them back to the model. A whole
``<tool_call>...</tool_call>`` block the parser rejected stays visible as content (the client
sees what the model tried); only the fragments inside it go. :class:`MarkupScrubber` removes
them from streamed content, holding back a trailing ``<`` that may start one until it is
decided. Each removed fragment is counted (``atlas_tool_markup_scrubbed`` on ``/metrics``).
"""

from __future__ import annotations

import re
import threading

#: Tags removed from content, whatever the tool-call format of the model.
MARKUP = re.compile(
    r"<(?:function|parameter)=[^<>\n]{0,200}>|</(?:function|parameter)>"
    r"|<\|tool_calls?_(?:section_)?(?:begin|end)\|>|<\|tool_call_argument_begin\|>"
    r"|\[TOOL_CALLS\]|<\|python_tag\|>")
#: Longest held-back tail that may still become a tag.
MAX_HOLDBACK = 210
#: How the tags begin: a tail of content that could still grow into one of these is held back.
_STARTS = ("<function=", "<parameter=", "</function>",
           "</parameter>", "<|tool_call", "<|python_tag|>", "[TOOL_CALLS]")

_lock = threading.Lock()
_num_scrubbed = 0


def num_scrubbed() -> int:
    """Fragments removed in this process so far."""
    return _num_scrubbed


def _count(n: int) -> None:
    global _num_scrubbed
    with _lock:
        _num_scrubbed += n


def scrub(text: str) -> str:
    """``text`` without tool-call markup (counted)."""
    out, n = MARKUP.subn("", text)
    if n:
        _count(n)
    return out


class MarkupScrubber:
    """Streaming :func:`scrub`: ``feed`` each content delta, ``finish`` at the end."""

    def __init__(self) -> None:
        self._pending = ""

    def feed(self, text: str) -> str:
        """The scrubbed content that is certain now."""
        text = scrub(self._pending + text)
        cut = max(text.rfind("<"), text.rfind("["))
        tail = text[cut:] if cut >= 0 else ""
        if tail and len(tail) <= MAX_HOLDBACK and any(
                s.startswith(tail) or (s.endswith("=") and tail.startswith(s)
                                       and ">" not in tail) for s in _STARTS):
            self._pending, text = tail, text[:cut]
        else:
            self._pending = ""
        return text

    def finish(self) -> str:
        """Whatever was held back, scrubbed."""
        text, self._pending = self._pending, ""
        return scrub(text)
