"""msgspec schemas of the Anthropic Messages API (the subset Atlas serves)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from atlas_core.server.openai_schemas import AgentFields


class ContentBlock(msgspec.Struct, kw_only=True):
    """One content block. ``text`` blocks carry ``text``; ``tool_use`` blocks ``id``/``name``/
    ``input``; ``tool_result`` blocks ``tool_use_id``/``content``; ``thinking`` blocks
    ``thinking``. Other fields (``cache_control``…) are accepted and ignored."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[dict[str, Any]] | None = None
    thinking: str | None = None
    signature: str | None = None
    is_error: bool | None = None
    source: dict[str, Any] | None = None


class Message(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentBlock]


class MessagesRequest(AgentFields, kw_only=True):
    """A Messages request. Fields Atlas does not use (``context_management``, ``metadata``,
    ``service_tier``, beta fields…) are accepted and ignored; ``messages`` may hold
    ``system`` entries (folded into the system prompt, see :mod:`atlas_core.server.prompts`)."""

    model: str | None = None
    messages: Annotated[list[Message], Meta(min_length=1)]
    max_tokens: Annotated[int, Meta(ge=1)]
    system: str | list[ContentBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0)] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    output_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class CountTokensRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    messages: Annotated[list[Message], Meta(min_length=1)]
    system: str | list[ContentBlock] | None = None
    tools: list[dict[str, Any]] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class Usage(msgspec.Struct):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessagesResponse(msgspec.Struct):
    """A whole message; ``content`` holds ``thinking``, ``text`` and ``tool_use`` blocks."""

    id: str
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None
    stop_sequence: str | None
    usage: Usage
    type: str = "message"
    role: str = "assistant"
