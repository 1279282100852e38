"""Responses API input items as chat-template messages.

Items: messages (``role`` + a string or ``input_text`` / ``output_text`` parts; user turns
also ``input_image`` parts, see :mod:`atlas_core.server.media`),
``function_call`` (merged into the assistant turn it belongs to), ``function_call_output``
(a ``tool`` message) and ``reasoning`` (the next assistant turn's ``reasoning_content``).
Output items of a response are valid input items too, which is how stored responses are
replayed for ``previous_response_id``.
"""

from __future__ import annotations

import json
from typing import Any

from atlas_core.server.errors import APIError, unsupported_part
from atlas_core.server.media import responses_image_part

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text", "text", "reasoning_text", "summary_text")


def parts_text(content: Any, param: str) -> str:
    """A string, or the text of a list of text parts (other parts are a 400)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise APIError(400, "content must be a string or a list of parts", param=param)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise unsupported_part(kind, f"{param}[{i}].type", "input_text and output_text")
        texts.append(part["text"])
    return "\n".join(texts)


def message_content(content: Any, param: str) -> str | list[dict]:
    """Message content for the template: :func:`parts_text`, or with ``input_image`` parts a
    list of text and image items (:mod:`atlas_core.server.media`)."""
    if not isinstance(content, list) or not any(
            isinstance(p, dict) and p.get("type") == "input_image" for p in content):
        return parts_text(content, param)
    items = []
    for i, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "input_image":
            items.append(responses_image_part(part, f"{param}[{i}]"))
        else:
            items.append({"type": "text", "text": parts_text([part], param)})
    return items


def _arguments(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw if raw is not None else {}
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _assistant(messages: list[dict], reasoning: str | None) -> dict:
    last = messages[-1] if messages else None
    if last is None or last["role"] != "assistant":
        last = {"role": "assistant", "content": ""}
        messages.append(last)
    if reasoning:
        last["reasoning_content"] = reasoning
    return last


def input_messages(items: str | list | None, param: str = "input") -> list[dict]:
    """Template messages of the Responses ``input``.

    Raises:
        APIError: 400 naming the item at fault.
    """
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict] = []
    reasoning: str | None = None
    for i, item in enumerate(items):
        where = f"{param}[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = ROLES.get(item.get("role"))
            if role is None:
                raise APIError(400, f"unknown role `{item.get('role')}`; use user, system, "
                               "developer or assistant", param=f"{where}.role")
            if role == "user":
                content = message_content(item.get("content"), f"{where}.content")
                messages.append({"role": role, "content": content})
                continue
            text = parts_text(item.get("content"), f"{where}.content")
            if role == "assistant":
                turn = _assistant(messages, reasoning)
                turn["content"] = (turn["content"] + "\n" + text) if turn["content"] else text
                reasoning = None
            else:
                messages.append({"role": role, "content": text})
        elif kind == "function_call":
            if not item.get("call_id") or not item.get("name"):
                raise APIError(400, "a function_call item needs call_id and name", param=where)
            turn = _assistant(messages, reasoning)
            reasoning = None
            function = {"name": item["name"], "arguments": _arguments(item.get("arguments"))}
            turn.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function", "function": function})
        elif kind == "function_call_output":
            if not item.get("call_id"):
                raise APIError(400, "a function_call_output item needs call_id", param=where)
            output = item.get("output")
            text = output if isinstance(output, str) else parts_text(output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning = parts_text(parts, f"{where}.content")
        else:
            raise APIError(400, f"input item type `{kind}` is not supported (this server takes "
                           "message, function_call, function_call_output and reasoning items)",
                           param=f"{where}.type")
    return messages
