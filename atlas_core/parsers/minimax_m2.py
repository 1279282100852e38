"""MiniMax-M2 XML tool calls.

``<minimax:tool_call>`` then one or more ``<invoke name="NAME"><parameter name="KEY">VALUE
</parameter>...</invoke>``, then ``</minimax:tool_call>`` (newlines between the tags, as the
model's chat template renders them). String values are raw text, others JSON; values are
converted to the types the tool's JSON schema declares when the tools are known (as
:mod:`atlas_core.parsers.qwen3_coder` does).
"""

from __future__ import annotations

from atlas_core.parsers.base import CallHead
from atlas_core.parsers.json_calls import skip_space
from atlas_core.parsers.qwen3_coder import XmlParameters, XmlToolParser

OPEN, CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE, END_INVOKE = "<invoke name=", "</invoke>"
PARAMETER, END_PARAMETER = "<parameter name=", "</parameter>"


def _attribute(raw: str) -> str:
    """A ``name=`` attribute value without its quotes (unquoted values are taken as written)."""
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        return raw[1:-1]
    return raw


class InvokeParameters(XmlParameters):
    """The arguments of one ``<invoke>``: a JSON object written out one parameter at a time,
    as each ``<parameter name="KEY">VALUE</parameter>`` completes; values typed by
    ``properties`` (the tool's schema)."""

    parameter, end_parameter, end_call, close = PARAMETER, END_PARAMETER, END_INVOKE, CLOSE

    def _key(self, raw: str) -> str:
        return _attribute(raw)


class MiniMaxM2ToolParser(XmlToolParser):
    """XML-style calls of MiniMax-M2 / M2.5 / M2.7 (parameters typed by the schema)."""

    name = "minimax_m2"
    markers = (OPEN,)
    open_tag, close_tag, call_tag = OPEN, CLOSE, INVOKE

    def match_head(self, text: str, start: int, final: bool, continued: bool = False) -> CallHead:
        pos = skip_space(text, start if continued else start + len(OPEN))
        if not text.startswith(INVOKE, pos):
            partial = not final and INVOKE.startswith(text[pos:])
            return CallHead("incomplete" if partial else "none")
        gt = text.find(">", pos + len(INVOKE))
        if gt < 0:
            return CallHead("none" if final else "incomplete")
        name = _attribute(text[pos + len(INVOKE):gt])
        if not name or "\n" in name:
            return CallHead("none")
        spec = self.tools.get(name, {})
        return CallHead("stream", name, None, gt + 1, InvokeParameters(spec.get("properties") or {}))
