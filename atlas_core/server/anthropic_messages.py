"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (Anthropic Messages API)."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, post

from atlas_core.server.anthropic_schemas import (CountTokensRequest, MessagesRequest,
                                                 MessagesResponse, TextBlock, Usage)
from atlas_core.server.decode import read_request
from atlas_core.server.errors import APIError
from atlas_core.server.generation import IDLE, Choice, as_api_error
from atlas_core.server.prompts import anthropic_messages, anthropic_tools, render_chat
from atlas_core.server.sampling import make_params, sampling_kwargs, stop_list
from atlas_core.server.sse import error_event, named_event, sse_response
from atlas_core.server.usage import prompt_usage

PATH = "/v1/messages"


def _template_kwargs(state, req) -> dict[str, Any]:
    kwargs = dict(state.config.default_chat_template_kwargs)
    thinking = (req.thinking or {}).get("type")
    if thinking in ("enabled", "adaptive"):
        kwargs["enable_thinking"] = True
    elif thinking == "disabled":
        kwargs["enable_thinking"] = False
    return {**kwargs, **(req.chat_template_kwargs or {})}


def prompt_ids_of(state, req) -> list[int]:
    """The rendered and tokenized conversation of a Messages or count_tokens request."""
    return render_chat(state.tokenizer, anthropic_messages(req.system, req.messages),
                       tools=anthropic_tools(req.tools),
                       template_kwargs=_template_kwargs(state, req))


def stop_reason_of(choice: Choice, stop_sequences: list[str]) -> tuple[str, str | None]:
    """Anthropic ``(stop_reason, stop_sequence)`` of a finished choice."""
    if choice.finish_reason == "length":
        return "max_tokens", None
    if isinstance(choice.stop_reason, str) and choice.stop_reason in stop_sequences:
        return "stop_sequence", choice.stop_reason
    return "end_turn", None


def usage_of(choice: Choice) -> Usage:
    prompt, cached = prompt_usage([choice], 1)
    return Usage(prompt - cached, len(choice.token_ids), 0, cached)


@post(PATH, status_code=200)
async def messages(request: Request) -> Any:
    state = request.app.state.atlas
    req = await read_request(request, MessagesRequest)
    model = state.resolve_model(req.model)
    state.require_engine()
    prompt_ids = prompt_ids_of(state, req)
    max_tokens = state.resolve_max_tokens(len(prompt_ids), req.max_tokens, "max_tokens")
    stops = stop_list(req.stop_sequences) or []
    fields = sampling_kwargs(req, max_tokens=max_tokens, stop=stops or None)
    rid = state.request_id("msg_")
    choice = Choice(0, rid, prompt_ids, make_params(fields, state.generation_defaults))
    if req.stream:
        stream = await state.stream([choice], idle_interval=state.config.ping_interval)
        return sse_response(_message_events(model, rid, stream, stops), stream)
    stream = await state.run([choice], receive=request.receive)
    if stream.timed_out:
        raise APIError(504, f"generation timed out after {state.config.request_timeout:g} s "
                       "(server --request-timeout)")
    reason, sequence = stop_reason_of(choice, stops)
    body = MessagesResponse(rid, model, [TextBlock(choice.text)], reason, sequence,
                            usage_of(choice))
    return Response(msgspec.json.encode(body), media_type="application/json")


async def _message_events(model: str, rid: str, stream, stops: list[str]):
    choice = stream.choices[0]
    started = False

    def start_events() -> list[bytes]:
        message = {"id": rid, "type": "message", "role": "assistant", "content": [],
                   "model": model, "stop_reason": None, "stop_sequence": None,
                   "usage": msgspec.to_builtins(usage_of(choice))}
        return [named_event("message_start", {"type": "message_start", "message": message}),
                named_event("content_block_start", {"type": "content_block_start", "index": 0,
                                                    "content_block": {"type": "text", "text": ""}})]
    try:
        async for ev in stream:
            if ev is IDLE:
                yield named_event("ping", {"type": "ping"})
                continue
            if not started:
                started = True
                for event in start_events():
                    yield event
            if ev.finish_reason == "abort":
                raise APIError(504, "generation was aborted (server --request-timeout reached)")
            if ev.text:
                yield named_event("content_block_delta", {
                    "type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": ev.text}})
        if not started:
            for event in start_events():
                yield event
        yield named_event("content_block_stop", {"type": "content_block_stop", "index": 0})
        reason, sequence = stop_reason_of(choice, stops)
        yield named_event("message_delta", {
            "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": msgspec.to_builtins(usage_of(choice))})
        yield named_event("message_stop", {"type": "message_stop"})
    except Exception as exc:  # noqa: BLE001 - the stream has started: report in-band
        yield error_event(as_api_error(exc), PATH)


@post(f"{PATH}/count_tokens", status_code=200)
async def count_tokens(request: Request) -> Any:
    state = request.app.state.atlas
    req = await read_request(request, CountTokensRequest)
    state.resolve_model(req.model)
    state.require_engine()
    return Response(msgspec.json.encode({"input_tokens": len(prompt_ids_of(state, req))}),
                    media_type="application/json")
