"""DeepSeek-V3 / V3.1 / R1 tool calls.

V3.1 (and its chat template)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜>...
    <｜tool▁calls▁end｜>

V3 / R1 put the call type first and the arguments in a fenced JSON block::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {ARGS}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

The markers are special tokens of the DeepSeek tokenizer: decode with
``skip_special_tokens=False`` (the server does when a parser's markers are special tokens).
Arguments stream as the model writes them.
"""

from __future__ import annotations

from atlas_core.parsers.base import CallHead, CallMatch, ToolParser
from atlas_core.parsers.json_calls import JsonArguments, skip_space

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
FENCE = "```"


def _expect(text: str, pos: int, token: str, final: bool) -> int | None | str:
    """``pos`` past ``token`` when it is there; ``"partial"`` when the text ends in its prefix
    (and more may come); None when something else is there."""
    if text.startswith(token, pos):
        return pos + len(token)
    if not final and token.startswith(text[pos:]):
        return "partial"
    return None


class DeepSeekV3ToolParser(ToolParser):
    """``<｜tool▁call▁begin｜>`` calls in the V3.1 form (name, ``<｜tool▁sep｜>``, JSON) and the
    V3 / R1 form (``function<｜tool▁sep｜>NAME`` then a fenced JSON block)."""

    name = "deepseek_v3"
    markers = (CALLS_BEGIN, CALL_BEGIN)

    def match_head(self, text: str, start: int, final: bool, continued: bool = False) -> CallHead:
        short = CallHead("none" if final else "incomplete")
        pos = start
        if text.startswith(CALLS_BEGIN, pos):
            pos = skip_space(text, pos + len(CALLS_BEGIN))
        pos = _expect(text, pos, CALL_BEGIN, final)
        if not isinstance(pos, int):
            return short if pos == "partial" else CallHead("none")
        sep = text.find(SEP, pos)
        if sep < 0:
            return CallHead("none") if final or CALL_END in text[pos:] else short
        first, body = text[pos:sep].strip(), skip_space(text, sep + len(SEP))
        if body == len(text):
            return short
        if first == "function" and text[body] != "{":
            return self._fenced_head(text, body, final)
        if not first or text[body] != "{":
            return CallHead("none")
        return CallHead("stream", first, None, body, JsonArguments((CALL_END,), outer=False), "v31")

    def _fenced_head(self, text: str, pos: int, final: bool) -> CallHead:
        short = CallHead("none" if final else "incomplete")
        newline = text.find("\n", pos)
        if newline < 0:
            return short
        name = text[pos:newline].strip()
        fence = _expect(text, newline + 1, FENCE, final)
        if not isinstance(fence, int) or not name:
            return short if fence == "partial" and name else CallHead("none")
        line_end = text.find("\n", fence)
        if line_end < 0:
            return short
        body = skip_space(text, line_end + 1)
        if body == len(text):
            return short
        if text[body] != "{":
            return CallHead("none")
        return CallHead("stream", name, None, body,
                        JsonArguments((FENCE, CALL_END), outer=False), "v3")

    def match_tail(self, text: str, pos: int, final: bool, head: CallHead) -> CallMatch:
        pos = skip_space(text, pos)
        if head.tail == "v3":
            fence = _expect(text, pos, FENCE, final)
            if fence == "partial":
                return CallMatch("incomplete")
            pos = skip_space(text, fence) if isinstance(fence, int) else pos
        end = _expect(text, pos, CALL_END, final)
        if end == "partial":
            return CallMatch("incomplete")
        if end is None:
            return CallMatch("complete", pos)
        after = skip_space(text, end)
        close = _expect(text, after, CALLS_END, final)
        if close == "partial":
            return CallMatch("incomplete")
        return CallMatch("complete", close if isinstance(close, int) else end)

    def match_call(self, text: str, start: int, final: bool) -> CallMatch:
        marker = next(m for m in self.markers if text.startswith(m, start))
        return CallMatch("invalid", start + len(marker))
