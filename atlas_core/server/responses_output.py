"""Responses API output items and their typed stream events, from shaped output.

:class:`ResponsesOutput` takes the shaper's events in order and builds the ``output`` items
(``reasoning``, ``message`` with ``output_text``, ``function_call``) together with the stream
events announcing them (``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta``, ``response.function_call_arguments.delta``, ... ``.done``).
A ``function_call`` item is added as soon as the call's name is known; its arguments follow in
``response.function_call_arguments.delta`` events as the model writes them.
Events are dicts without ``sequence_number``; the endpoint numbers them as it sends them.
"""

from __future__ import annotations

import secrets

from atlas_core.parsers import ParserEvents, ToolCallDelta
from atlas_core.server.shaping import ordered_parts

_TEXT = {"message": ("output_text", "response.output_text"),
         "reasoning": ("reasoning_text", "response.reasoning_text")}


def item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class ResponsesOutput:
    """The output items of one response, built incrementally.

    Attributes:
        items: the output items so far (the open one included, still ``in_progress``).
    """

    def __init__(self) -> None:
        self.items: list[dict] = []
        self._open: str | None = None

    def _part(self, item: dict) -> dict:
        return item["content"][0]

    def _where(self) -> dict:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1}

    def _add(self, item: dict) -> dict:
        self.items.append(item)
        return {"type": "response.output_item.added", "output_index": len(self.items) - 1,
                "item": {**item, "content": []} if "content" in item else dict(item)}

    def _done_item(self, status: str) -> dict:
        item = self.items[-1]
        item["status"] = status
        return {"type": "response.output_item.done", "output_index": len(self.items) - 1,
                "item": item}

    def close(self, status: str = "completed") -> list[dict]:
        """End the open text item, if any."""
        if self._open is None:
            return []
        kind, self._open = self._open, None
        if kind == "call":
            item = self.items[-1]
            return [{"type": "response.function_call_arguments.done", **self._where(),
                     "name": item["name"], "arguments": item["arguments"]},
                    self._done_item(status)]
        part_type, prefix = _TEXT[kind]
        part = self._part(self.items[-1])
        done = {"type": f"{prefix}.done", **self._where(), "content_index": 0,
                "text": part["text"]}
        if kind == "message":
            done["logprobs"] = []
        return [done, {"type": "response.content_part.done", **self._where(),
                       "content_index": 0, "part": part}, self._done_item(status)]

    def _open_text(self, kind: str) -> list[dict]:
        part_type = _TEXT[kind][0]
        part = {"type": part_type, "text": ""}
        if kind == "message":
            part["annotations"] = []
            item = {"type": "message", "id": item_id("msg"), "status": "in_progress",
                    "role": "assistant", "content": [part]}
        else:
            item = {"type": "reasoning", "id": item_id("rs"), "summary": [], "content": [part],
                    "status": "in_progress"}
        self._open = kind
        added = self._add(item)
        return [added, {"type": "response.content_part.added", **self._where(),
                        "content_index": 0, "part": dict(part)}]

    def _call(self, delta: ToolCallDelta, status: str) -> list[dict]:
        out: list[dict] = []
        if delta.name is not None:
            out += self.close()
            out.append(self._add({"type": "function_call", "id": item_id("fc"),
                                  "call_id": delta.id, "name": delta.name, "arguments": "",
                                  "status": "in_progress"}))
            self._open = "call"
        if self._open != "call":
            return out
        if delta.arguments:
            self.items[-1]["arguments"] += delta.arguments
            out.append({"type": "response.function_call_arguments.delta", **self._where(),
                        "delta": delta.arguments})
        return out + (self.close(status) if delta.done else [])

    def add(self, events: ParserEvents, status: str = "completed") -> list[dict]:
        """Take one shaper step; return its stream events. A call that ends in this step is
        closed with ``status`` (``incomplete`` for the last step of a cut-off output)."""
        out: list[dict] = []
        for kind, value in ordered_parts(events):
            if kind == "tool_call":
                out += self._call(value, status)
                continue
            item_kind = "reasoning" if kind == "reasoning" else "message"
            if self._open != item_kind:
                out += self.close() + self._open_text(item_kind)
            self._part(self.items[-1])["text"] += value
            delta = {"type": f"{_TEXT[item_kind][1]}.delta", **self._where(),
                     "content_index": 0, "delta": value}
            if item_kind == "message":
                delta["logprobs"] = []
            out.append(delta)
        return out

    def finish(self, status: str = "completed") -> list[dict]:
        """Close the last item (``incomplete`` when the output was cut short)."""
        return self.close(status)

    @property
    def reasoning_text(self) -> str:
        return "".join(self._part(i)["text"] for i in self.items if i["type"] == "reasoning")
