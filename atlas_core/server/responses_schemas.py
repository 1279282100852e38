"""msgspec schema of ``POST /v1/responses`` requests (the subset Atlas serves).

Input and output items stay plain dicts: their many shapes are checked where they are read
(:mod:`atlas_core.server.responses_input`). Unknown fields are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta


class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    truncation: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
