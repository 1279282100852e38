"""``POST /v1/chat/completions``.

Text coming out of the engine goes through an output shaper (``shaper.feed(text)`` per delta,
``shaper.finish()`` at the end) that splits it into ``content`` / ``reasoning_content`` /
``tool_calls``. The default shaper passes everything through as ``content``; reasoning and
tool-call parsers slot in by replacing ``ServerState.make_chat_shaper``.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from litestar import Request, Response, post

from atlas_core.server.decode import read_request
from atlas_core.server.errors import APIError
from atlas_core.server.generation import IDLE, Choice, as_api_error
from atlas_core.server.logprobs import chat_logprobs
from atlas_core.server.openai_schemas import (ChatChoice, ChatChunkChoice, ChatCompletionChunk,
                                              ChatCompletionRequest, ChatCompletionResponse,
                                              ChatDelta, ResponseMessage)
from atlas_core.server.prompts import openai_messages, render_chat
from atlas_core.server.sampling import logit_bias, make_params, sampling_kwargs, stop_list
from atlas_core.server.sse import DONE, data_event, error_event, sse_response
from atlas_core.server.usage import openai_usage


class PlainShaper:
    """Passes generated text through as ``content``."""

    def feed(self, text: str) -> dict[str, Any]:
        return {"content": text} if text else {}

    def finish(self) -> dict[str, Any]:
        return {}


def _check_supported(req: ChatCompletionRequest) -> None:
    fmt = (req.response_format or {}).get("type", "text")
    if fmt != "text":
        raise APIError(400, f"response_format type `{fmt}` is not supported yet; use text",
                       param="response_format.type")
    if isinstance(req.tool_choice, dict) or req.tool_choice == "required":
        raise APIError(400, "forcing a tool call (tool_choice) is not supported yet; use `auto`",
                       param="tool_choice")


def build_choices(state, req: ChatCompletionRequest, rid: str) -> list[Choice]:
    """Render the prompt; its ``n`` choices are the completions of one engine request."""
    _check_supported(req)
    if req.n > state.config.max_n:
        raise APIError(400, f"n must be <= {state.config.max_n}", param="n")
    kwargs = {**state.config.default_chat_template_kwargs, **(req.chat_template_kwargs or {})}
    tools = req.tools if req.tools and req.tool_choice != "none" else None
    prompt_ids = render_chat(state.tokenizer, openai_messages(req.messages), tools=tools,
                             add_generation_prompt=req.add_generation_prompt,
                             continue_final_message=req.continue_final_message,
                             template_kwargs=kwargs)
    param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    max_tokens = state.resolve_max_tokens(len(prompt_ids), req.max_completion_tokens
                                          or req.max_tokens, param)
    if req.top_logprobs and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    fields = sampling_kwargs(req, max_tokens=max_tokens, seed=req.seed, stop=stop_list(req.stop),
                             stop_token_ids=req.stop_token_ids,
                             logit_bias=logit_bias(req.logit_bias),
                             logprobs=(req.top_logprobs or 0) if req.logprobs else None)
    params = make_params(fields, state.generation_defaults, req.n)
    return [Choice(i, rid, prompt_ids, params, output_index=i) for i in range(req.n)]


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request) -> Any:
    state = request.app.state.atlas
    req = await read_request(request, ChatCompletionRequest)
    model = state.resolve_model(req.model)
    state.require_engine()
    rid = state.request_id("chatcmpl-")
    choices = build_choices(state, req, rid)
    if req.stream:
        stream = await state.stream(choices)
        return sse_response(_chat_events(state, req, model, rid, stream), stream)
    stream = await state.run(choices, receive=request.receive)
    result = []
    for c in choices:
        shaper = state.make_chat_shaper(req)
        parts = {**shaper.feed(c.text)}
        for key, value in shaper.finish().items():
            parts[key] = (parts.get(key) or "") + value if isinstance(value, str) else value
        logprobs = (chat_logprobs(state.tokenizer, c.logprobs, req.top_logprobs or 0)
                    if req.logprobs else None)
        message = ResponseMessage("assistant", parts.get("content", ""), parts.get("tool_calls"),
                                  parts.get("reasoning_content"))
        result.append(ChatChoice(c.index, message, logprobs, c.finish_reason, c.stop_reason))
    usage = openai_usage(choices, req.n)
    body = ChatCompletionResponse(rid, int(time.time()), model, result, usage)
    return Response(msgspec.json.encode(body), media_type="application/json")


async def _chat_events(state, req: ChatCompletionRequest, model: str, rid: str, stream):
    created = int(time.time())
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    shapers = {c.index: state.make_chat_shaper(req) for c in stream.choices}

    def chunk(index: int, delta: ChatDelta, logprobs=None, finish=None) -> bytes:
        choice = ChatChunkChoice(index, delta, logprobs, finish)
        return data_event(ChatCompletionChunk(rid, created, model, [choice]))
    try:
        for c in stream.choices:
            yield chunk(c.index, ChatDelta(role="assistant", content=""))
        async for ev in stream:
            if ev is IDLE:
                continue
            parts = shapers[ev.index].feed(ev.text)
            if ev.finish_reason is not None:
                parts.update(shapers[ev.index].finish())
            logprobs = (chat_logprobs(state.tokenizer, ev.logprobs, req.top_logprobs or 0)
                        if req.logprobs and ev.logprobs else None)
            if parts or logprobs or ev.finish_reason:
                yield chunk(ev.index, ChatDelta(**parts), logprobs, ev.finish_reason)
        if include_usage:
            usage = openai_usage(stream.choices, req.n)
            yield data_event(ChatCompletionChunk(rid, created, model, [], usage))
        yield DONE
    except Exception as exc:  # noqa: BLE001 - the stream has started: report in-band
        yield error_event(as_api_error(exc), "/v1/chat/completions")
        yield DONE
