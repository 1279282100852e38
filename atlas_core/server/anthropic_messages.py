"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (Anthropic Messages API)."""

from __future__ import annotations

import asyncio

from typing import Any

import msgspec
from litestar import Request, Response, post

from atlas_core.server.agent import ChatRequest, checked_stops, plan_chat, render_request
from atlas_core.server.anthropic_blocks import AnthropicBlocks
from atlas_core.server.anthropic_schemas import (CountTokensRequest, MessagesRequest,
                                                 MessagesResponse, Usage)
from atlas_core.server.decode import read_model_request
from atlas_core.server.errors import APIError
from atlas_core.server.generation import IDLE, Choice, as_api_error
from atlas_core.server.media import attach_images
from atlas_core.server.prompts import anthropic_messages
from atlas_core.server.sampling import sampling_kwargs, stop_list
from atlas_core.server.sse import error_event, named_event, sse_response
from atlas_core.server.thinking import from_anthropic
from atlas_core.server.tools import anthropic_tool_choice, anthropic_tools
from atlas_core.server.usage import prompt_usage

PATH = "/v1/messages"


def chat_request(req, max_tokens: int | None = None, stops: list[str] | None = None
                 ) -> ChatRequest:
    """The API-neutral form of a Messages (or count_tokens) request."""
    tools = anthropic_tools(req.tools)
    choice, parallel = anthropic_tool_choice(getattr(req, "tool_choice", None), tools)
    sampling = sampling_kwargs(req, stop=stops or None) if max_tokens else {}
    messages = anthropic_messages(req.system, req.messages)
    thinking = from_anthropic(req.thinking, req.output_config)
    fmt, fmt_param = output_format(req)
    return ChatRequest(messages, tools, choice, parallel, thinking, req.chat_template_kwargs,
                       sampling, max_tokens, continue_final_message=is_prefill(messages),
                       response_format=fmt, format_param=fmt_param)


def output_format(req) -> tuple[dict | None, str]:
    """Anthropic structured output (``output_config.format``, or the beta's ``output_format``:
    ``{"type": "json_schema", "schema": {...}}``) as an OpenAI ``response_format``."""
    config = req.output_config if isinstance(req.output_config, dict) else {}
    fmt, param = config.get("format"), "output_config.format"
    if fmt is None:
        fmt, param = getattr(req, "output_format", None), "output_format"
    if fmt is None:
        return None, param
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise APIError(400, f"{param}.type must be json_schema", param=f"{param}.type")
    return {"type": "json_schema", "json_schema": {"schema": fmt.get("schema")}}, param


def is_prefill(messages: list[dict]) -> bool:
    """A conversation ending on assistant text: Anthropic continues that text (prefill)."""
    last = messages[-1] if messages else {}
    return (last.get("role") == "assistant" and isinstance(last.get("content"), str)
            and bool(last["content"]) and not last.get("tool_calls"))


def omits_thinking(req: MessagesRequest) -> bool:
    """``thinking.display: "omitted"``: thinking blocks come back empty, with a signature."""
    return isinstance(req.thinking, dict) and req.thinking.get("display") == "omitted"


def stop_reason_of(choice: Choice, stop_sequences: list[str], blocks: AnthropicBlocks
                   ) -> tuple[str, str | None]:
    """Anthropic ``(stop_reason, stop_sequence)`` of a finished choice."""
    if choice.finish_reason == "length":
        return "max_tokens", None
    if isinstance(choice.stop_reason, str) and choice.stop_reason in stop_sequences:
        return "stop_sequence", choice.stop_reason
    if blocks.has_tool_use:
        return "tool_use", None
    return "end_turn", None


def usage_of(choice: Choice) -> Usage:
    prompt, cached = prompt_usage([choice], 1)
    return Usage(prompt - cached, len(choice.token_ids), 0, cached)


@post(PATH, status_code=200)
async def messages(request: Request) -> Any:
    state, req, model = await read_model_request(request, MessagesRequest)
    stops = checked_stops(stop_list(req.stop_sequences), "stop_sequences") or []
    plan = await asyncio.to_thread(plan_chat, state, chat_request(req, req.max_tokens, stops))
    rid = state.request_id("msg_")
    choice = Choice(0, rid, plan.prompt_ids, plan.params, mm=plan.mm)
    shaper = state.make_chat_shaper(plan)
    if req.stream:
        stream = await state.stream([choice], idle_interval=state.config.ping_interval)
        blocks = AnthropicBlocks(omits_thinking(req))
        return sse_response(_message_events(model, rid, stream, stops, shaper, blocks), stream)
    stream = await state.run([choice], receive=request.receive)
    state.raise_if_timed_out(stream)
    blocks = AnthropicBlocks(omits_thinking(req))
    blocks.add(shaper.feed_all(choice.text))
    blocks.finish()
    reason, sequence = stop_reason_of(choice, stops, blocks)
    body = MessagesResponse(rid, model, blocks.blocks, reason, sequence, usage_of(choice))
    return Response(msgspec.json.encode(body), media_type="application/json")


async def _message_events(model: str, rid: str, stream, stops: list[str], shaper,
                          blocks: AnthropicBlocks):
    choice = stream.choices[0]
    started = False

    def start_event() -> bytes:
        message = {"id": rid, "type": "message", "role": "assistant", "content": [],
                   "model": model, "stop_reason": None, "stop_sequence": None,
                   "usage": msgspec.to_builtins(usage_of(choice))}
        return named_event("message_start", {"type": "message_start", "message": message})
    try:
        async for ev in stream:
            if ev is IDLE:
                yield named_event("ping", {"type": "ping"})
                continue
            if not started:
                started = True
                yield start_event()
            if ev.finish_reason == "abort" and stream.stopping:
                raise APIError(503, "the server is shutting down; retry once it is back")
            if ev.finish_reason == "abort":
                raise APIError(504, "generation was aborted (server --request-timeout reached)")
            for event in blocks.add(shaper.feed(ev.text)):
                yield event
        if not started:
            yield start_event()
        for event in blocks.add(shaper.finish()) + blocks.finish():
            yield event
        reason, sequence = stop_reason_of(choice, stops, blocks)
        yield named_event("message_delta", {
            "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": msgspec.to_builtins(usage_of(choice))})
        yield named_event("message_stop", {"type": "message_stop"})
    except Exception as exc:  # noqa: BLE001 - the stream has started: report in-band
        yield error_event(as_api_error(exc), PATH)


def _prompt_ids(state, req: ChatRequest) -> list[int]:
    """The prompt ids a request would run with, images expanded to their tokens."""
    ids = render_request(state, req)[1]
    return attach_images(state, req.messages, ids)[0]


@post(f"{PATH}/count_tokens", status_code=200)
async def count_tokens(request: Request) -> Any:
    state, req, _ = await read_model_request(request, CountTokensRequest)
    ids = await asyncio.to_thread(_prompt_ids, state, chat_request(req))
    return Response(msgspec.json.encode({"input_tokens": len(ids)}),
                    media_type="application/json")
