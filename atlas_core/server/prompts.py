"""Turning API messages into prompt token ids through the model's chat template.

Both APIs are first converted to OpenAI-style message dicts (``role``, ``content`` text,
``tool_calls``, ``tool_call_id``, ``reasoning_content``), which is what HF chat templates read.
A turn with images has list content: ``{"type": "text", "text"}`` and ``{"type": "image",
"image": ImageRef}`` items (:mod:`atlas_core.server.media`), as vision-language templates take.
"""

from __future__ import annotations

from typing import Any

from atlas_core.server.errors import APIError, unsupported_part
from atlas_core.server.media import anthropic_image_block, openai_image_part
from atlas_core.server.tools import template_tool_calls
from atlas_core.tokenizer.chat_template import adapt_tool_arguments, tool_arguments_form

CHAT_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def text_of_parts(content: Any, param: str) -> str | None:
    """Flatten OpenAI message content (a string or text parts) to one string."""
    if content is None or isinstance(content, str):
        return content
    texts = []
    for i, part in enumerate(content):
        if part.type not in ("text", "input_text", "output_text") or part.text is None:
            raise unsupported_part(part.type, f"{param}.content[{i}].type", "text only")
        texts.append(part.text)
    return "\n".join(texts)


def chat_content(content: Any, param: str) -> str | list[dict] | None:
    """OpenAI message content for the template: one string, or, when it has ``image_url``
    parts, a list of ``{"type": "text"}`` and ``{"type": "image"}`` items in order."""
    if content is None or isinstance(content, str) or all(p.type != "image_url" for p in content):
        return text_of_parts(content, param)
    items: list[dict] = []
    for i, part in enumerate(content):
        if part.type == "image_url":
            items.append(openai_image_part(part.image_url, f"{param}.content[{i}]"))
        else:
            items.append({"type": "text", "text": text_of_parts([part], param)})
    return items


def openai_messages(messages: list) -> list[dict]:
    """OpenAI chat messages as template dicts (``developer`` is rendered as ``system``)."""
    converted = []
    for i, m in enumerate(messages):
        if m.role not in CHAT_ROLES:
            raise APIError(400, f"unknown role `{m.role}`; use one of system, developer, user, "
                           "assistant, tool", param=f"messages[{i}].role")
        item: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                                "content": chat_content(m.content, f"messages[{i}]") or ""}
        for key in ("name", "tool_call_id", "reasoning_content"):
            if getattr(m, key) is not None:
                item[key] = getattr(m, key)
        if m.tool_calls:
            item["tool_calls"] = template_tool_calls(m.tool_calls)
        converted.append(item)
    return converted


def _block_text(content: Any, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text":
            raise unsupported_part(kind, f"{param}[{i}].type", "text blocks in a tool_result")
        texts.append(block.get("text", ""))
    return "\n".join(texts)


def system_text(system: Any, param: str = "system") -> str | None:
    """Anthropic ``system`` (a string or text blocks) as one string."""
    if system is None or isinstance(system, str):
        return system
    for i, block in enumerate(system):
        if block.type != "text":
            raise unsupported_part(block.type, f"{param}[{i}].type", "text blocks")
    return "\n".join(block.text or "" for block in system)


def _anthropic_turn(role: str, content: Any, param: str) -> list[dict]:
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    texts, thinking, tool_calls, results, items = [], [], [], [], []
    for i, block in enumerate(content):
        if block.type == "text":
            texts.append(block.text or "")
            items.append({"type": "text", "text": block.text or ""})
        elif block.type == "image":
            items.append(anthropic_image_block(block.source, f"{param}.content[{i}]"))
        elif block.type in ("thinking", "redacted_thinking"):
            thinking.append(block.thinking or "")
        elif block.type == "tool_use":
            tool_calls.append({"id": block.id, "type": "function",
                               "function": {"name": block.name, "arguments": block.input or {}}})
        elif block.type == "tool_result":
            text = _block_text(block.content, f"{param}.content[{i}].content")
            results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": text})
        else:
            raise unsupported_part(block.type, f"{param}.content[{i}].type",
                                   "text, tool_use and tool_result blocks")
    has_image = len(items) > len(texts)
    turn: dict[str, Any] = {"role": role, "content": items if has_image else "\n".join(texts)}
    if thinking:
        turn["reasoning_content"] = "\n".join(thinking)
    if tool_calls:
        turn["tool_calls"] = tool_calls
    if results and not texts and not has_image:
        return results
    return results + [turn]


def anthropic_messages(system: Any, messages: list) -> list[dict]:
    """Anthropic ``system`` + ``messages`` as template dicts.

    ``{"role": "system"}`` entries inside ``messages`` (sent by Claude Code) are folded, in
    order, into the one leading system message after ``system``: many chat templates accept a
    system message only at the start.
    """
    converted = []
    system_parts = [system_text(system)]
    for i, m in enumerate(messages):
        if m.role == "system":
            system_parts.append(system_text(m.content, f"messages[{i}].content"))
            continue
        if m.role not in ("user", "assistant"):
            raise APIError(400, f"unknown role `{m.role}`; Anthropic messages are user, "
                           "assistant or system", param=f"messages[{i}].role")
        converted.extend(_anthropic_turn(m.role, m.content, f"messages[{i}]"))
    text = "\n\n".join(part for part in system_parts if part)
    return ([{"role": "system", "content": text}] if text else []) + converted


def template_messages(tokenizer, messages: list[dict], has_tools: bool) -> list[dict]:
    """``messages`` with tool-call arguments of the kind the chat template reads: OpenAI sends
    JSON text, Anthropic objects; DeepSeek-V3.1's template joins them as text, Qwen3.5's
    iterates them as an object (see :mod:`atlas_core.tokenizer.chat_template`)."""
    select = getattr(tokenizer, "select_chat_template", None)
    try:
        source = select(has_tools=has_tools) if select is not None else None
    except ValueError:
        return messages
    if not isinstance(source, str):
        return messages
    return adapt_tool_arguments(messages, tool_arguments_form(source))


def render_chat(tokenizer, messages: list[dict], **kwargs) -> list[int]:
    """Render ``messages`` with the chat template and encode them (see :func:`render_prompt`)."""
    return render_prompt(tokenizer, messages, **kwargs)[1]


def render_prompt(tokenizer, messages: list[dict], *, tools: list | None = None,
                  add_generation_prompt: bool = True, continue_final_message: bool = False,
                  template_kwargs: dict | None = None) -> tuple[str, list[int]]:
    """Render ``messages`` with the chat template; return the text and its token ids.

    Raises:
        APIError: 400 when the template rejects the conversation or there is no template.
        PromptTooLong: the messages' text alone cannot fit the context (found before rendering).
    """
    check_size = getattr(tokenizer, "check_input_size", None)
    if check_size is not None:
        texts = (m.get(key) for m in messages for key in ("content", "reasoning_content"))
        check_size(sum(len(text) for text in texts if isinstance(text, str)))
    try:
        text = tokenizer.apply_chat_template(
            template_messages(tokenizer, messages, tools is not None), tools=tools,
            add_generation_prompt=add_generation_prompt and
            not continue_final_message, **(template_kwargs or {}))
    except ValueError as exc:
        raise APIError(400, f"cannot render the conversation: {exc}", param="messages") from None
    if continue_final_message:
        last = messages[-1].get("content") or ""
        last = last if isinstance(last, str) else ""
        cut = text.rfind(last)
        if last and cut >= 0:
            text = text[:cut + len(last)]
    return text, tokenizer.encode(text, add_special_tokens=False)
