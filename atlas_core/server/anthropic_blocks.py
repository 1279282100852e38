"""Anthropic content blocks (``thinking``, ``text``, ``tool_use``) from shaped output.

:class:`AnthropicBlocks` takes the shaper's events in order, builds the message's ``content``
and, for streams, the matching ``content_block_start`` / ``content_block_delta``
(``thinking_delta``, ``signature_delta``, ``text_delta``, ``input_json_delta``) /
``content_block_stop`` events. A tool call's block starts (``input: {}``) as soon as its name is
known and gets one ``input_json_delta`` per piece of arguments the model writes. Since clients
parse those pieces as partial JSON, arguments that stop being valid JSON are passed on only up
to the first invalid character; the block's final ``input`` is then ``{"arguments": raw text}``.
"""

from __future__ import annotations

import base64
import hashlib
import json

from atlas_core.parsers import ParserEvents, ToolCallDelta
from atlas_core.parsers.json_prefix import JsonPrefix
from atlas_core.server.shaping import ordered_parts
from atlas_core.server.sse import named_event

_DELTAS = {"thinking": ("thinking_delta", "thinking"), "text": ("text_delta", "text")}


def thinking_signature(thinking: str) -> str:
    """An opaque signature for a thinking block (a digest of its text; clients send it back,
    Atlas does not check it)."""
    return base64.b64encode(hashlib.sha256(thinking.encode()).digest()).decode()


def tool_input(arguments: str) -> dict:
    """A call's JSON arguments as the ``input`` object (non-objects are wrapped)."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"value": value}


class AnthropicBlocks:
    """Accumulates the content blocks of one message; :meth:`add` returns stream events.

    Args:
        omit_thinking: thinking blocks keep an empty ``thinking`` text (no ``thinking_delta``
            events) and only their signature (Anthropic ``thinking.display: "omitted"``).
    """

    def __init__(self, omit_thinking: bool = False) -> None:
        self.omit_thinking = omit_thinking
        self._thought = ""
        self.blocks: list[dict] = []
        self._open: str | None = None
        self._arguments, self._json = "", JsonPrefix()

    @property
    def has_tool_use(self) -> bool:
        return any(b["type"] == "tool_use" for b in self.blocks)

    def _event(self, name: str, **payload) -> bytes:
        return named_event(name, {"type": name, **payload})

    def _start(self, block: dict, start: dict) -> bytes:
        self.blocks.append(block)
        return self._event("content_block_start", index=len(self.blocks) - 1, content_block=start)

    def _delta(self, delta: dict) -> bytes:
        return self._event("content_block_delta", index=len(self.blocks) - 1, delta=delta)

    def close(self) -> list[bytes]:
        """End the open block, if any."""
        if self._open is None:
            return []
        out = []
        block = self.blocks[-1]
        if block["type"] == "thinking":
            block["signature"] = thinking_signature(self._thought)
            out.append(self._delta({"type": "signature_delta", "signature": block["signature"]}))
        elif block["type"] == "tool_use":
            block["input"] = tool_input(self._arguments)
        out.append(self._event("content_block_stop", index=len(self.blocks) - 1))
        self._open = None
        return out

    def _tool_call(self, delta: ToolCallDelta) -> list[bytes]:
        out: list[bytes] = []
        if delta.name is not None:
            out += self.close()
            block = {"type": "tool_use", "id": delta.id, "name": delta.name, "input": {}}
            out.append(self._start(block, dict(block)))
            self._open, self._arguments, self._json = "tool_use", "", JsonPrefix()
        if self._open != "tool_use":
            return out
        self._arguments += delta.arguments
        valid = delta.arguments[:self._json.feed(delta.arguments)]
        if valid:
            out.append(self._delta({"type": "input_json_delta", "partial_json": valid}))
        return out + (self.close() if delta.done else [])

    def add(self, events: ParserEvents) -> list[bytes]:
        """Take one shaper step; return its stream events."""
        out: list[bytes] = []
        for kind, value in ordered_parts(events):
            if kind == "tool_call":
                out += self._tool_call(value)
                continue
            block_type = "thinking" if kind == "reasoning" else "text"
            if self._open != block_type:
                out += self.close()
                start = ({"type": "thinking", "thinking": "", "signature": ""}
                         if block_type == "thinking" else {"type": "text", "text": ""})
                out.append(self._start(dict(start), start))
                self._open, self._thought = block_type, ""
            if block_type == "thinking":
                self._thought += value
                if self.omit_thinking:
                    continue
            delta_type, key = _DELTAS[block_type]
            self.blocks[-1][key] += value
            out.append(self._delta({"type": delta_type, key: value}))
        return out

    def finish(self) -> list[bytes]:
        """Close the last block; an empty message gets one empty text block."""
        out = self.close()
        if not self.blocks:
            out.append(self._start({"type": "text", "text": ""}, {"type": "text", "text": ""}))
            self._open = "text"
            out += self.close()
        return out
