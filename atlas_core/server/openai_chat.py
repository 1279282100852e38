"""``POST /v1/chat/completions``.

Text coming out of the engine goes through an output shaper (``ServerState.make_chat_shaper``,
an :class:`~atlas_core.server.shaping.OutputShaper` by default) that splits it into
``content``, ``reasoning_content`` (also sent as ``reasoning``) and ``tool_calls``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
from litestar import Request, Response, post

from atlas_core.parsers import ParserEvents
from atlas_core.server.agent import (ChatPlan, ChatRequest, checked_stops, plan_chat,
                                     vllm_constraint)
from atlas_core.server.decode import read_model_request
from atlas_core.server.errors import APIError
from atlas_core.server.generation import IDLE, Choice, as_api_error
from atlas_core.server.logprobs import chat_logprobs
from atlas_core.server.openai_schemas import (ChatChoice, ChatChunkChoice, ChatCompletionChunk,
                                              ChatCompletionRequest, ChatCompletionResponse,
                                              ChatDelta, ResponseMessage)
from atlas_core.server.prompts import openai_messages
from atlas_core.server.sampling import logit_bias, sampling_kwargs, stop_list
from atlas_core.server.sse import DONE, data_event, error_event, sse_response
from atlas_core.server.thinking import from_effort
from atlas_core.server.tools import chat_tools, openai_tool_choice
from atlas_core.server.usage import openai_usage


def chat_request(req: ChatCompletionRequest) -> ChatRequest:
    """The API-neutral form of a chat completion request."""
    if req.top_logprobs and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    tools = chat_tools(req.tools)
    guided, guided_param = vllm_constraint(req)
    sampling = sampling_kwargs(req, seed=req.seed, stop=checked_stops(stop_list(req.stop)),
                               stop_token_ids=req.stop_token_ids,
                               logit_bias=logit_bias(req.logit_bias),
                               logprobs=(req.top_logprobs or 0) if req.logprobs else None)
    return ChatRequest(
        openai_messages(req.messages), tools, openai_tool_choice(req.tool_choice, tools),
        req.parallel_tool_calls is not False, from_effort(req.reasoning_effort),
        req.chat_template_kwargs, sampling, req.max_completion_tokens or req.max_tokens,
        "max_completion_tokens" if req.max_completion_tokens else "max_tokens", req.n,
        req.add_generation_prompt, req.continue_final_message, req.response_format,
        guided=guided, guided_param=guided_param or "guided_json")


def build_choices(state, req: ChatCompletionRequest, rid: str) -> tuple[ChatPlan, list[Choice]]:
    """Plan the request; its ``n`` choices are the completions of one engine request."""
    if req.n > state.config.max_n:
        raise APIError(400, f"n must be <= {state.config.max_n}", param="n")
    plan = plan_chat(state, chat_request(req))
    return plan, [Choice(i, rid, plan.prompt_ids, plan.params, output_index=i, mm=plan.mm)
                  for i in range(req.n)]


def response_message(shaper) -> ResponseMessage:
    """The whole assistant message of a finished choice."""
    calls = [{"id": c.id, "type": "function",
              "function": {"name": c.name, "arguments": c.arguments}} for c in shaper.tool_calls]
    content = shaper.content if shaper.content or not calls else None
    reasoning = shaper.reasoning or None
    return ResponseMessage("assistant", content, calls or None, reasoning, reasoning)


def chat_deltas(events: ParserEvents) -> list[ChatDelta]:
    """Stream deltas of one shaper step. A tool call is announced as soon as its name is known
    (``index``, ``id``, ``type``, ``function.name``, ``arguments: ""``); its arguments follow in
    pieces as the model writes them (``index`` and ``function.arguments`` only)."""
    deltas = []
    if events.content or events.reasoning:
        reasoning = events.reasoning or None
        deltas.append(ChatDelta(content=events.content or None, reasoning_content=reasoning,
                                reasoning=reasoning))
    for call in events.tool_calls:
        if call.name is not None:
            head = {"index": call.index, "id": call.id, "type": "function",
                    "function": {"name": call.name, "arguments": ""}}
            deltas.append(ChatDelta(tool_calls=[head]))
        if call.arguments:
            deltas.append(ChatDelta(tool_calls=[{"index": call.index,
                                                 "function": {"arguments": call.arguments}}]))
    return deltas


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request) -> Any:
    state, req, model = await read_model_request(request, ChatCompletionRequest)
    rid = state.request_id("chatcmpl-")
    plan, choices = await asyncio.to_thread(build_choices, state, req, rid)
    if req.stream:
        stream = await state.stream(choices)
        return sse_response(_chat_events(state, req, plan, model, rid, stream), stream)
    await state.run(choices, receive=request.receive)
    result = []
    for c in choices:
        shaper = state.make_chat_shaper(plan)
        shaper.feed_all(c.text)
        logprobs = (chat_logprobs(state.tokenizer, c.logprobs, req.top_logprobs or 0)
                    if req.logprobs else None)
        result.append(ChatChoice(c.index, response_message(shaper), logprobs,
                                 shaper.finish_reason(c.finish_reason), c.stop_reason))
    usage = openai_usage(choices, req.n)
    body = ChatCompletionResponse(rid, int(time.time()), model, result, usage)
    return Response(msgspec.json.encode(body), media_type="application/json")


async def _chat_events(state, req: ChatCompletionRequest, plan: ChatPlan, model: str, rid: str,
                       stream):
    created = int(time.time())
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    shapers = {c.index: state.make_chat_shaper(plan) for c in stream.choices}

    def chunk(index: int, delta: ChatDelta, logprobs=None, finish=None) -> bytes:
        choice = ChatChunkChoice(index, delta, logprobs, finish)
        return data_event(ChatCompletionChunk(rid, created, model, [choice]))
    try:
        for c in stream.choices:
            yield chunk(c.index, ChatDelta(role="assistant", content=""))
        async for ev in stream:
            if ev is IDLE:
                continue
            shaper = shapers[ev.index]
            done = ev.finish_reason is not None
            events = shaper.feed_all(ev.text) if done else shaper.feed(ev.text)
            finish = shaper.finish_reason(ev.finish_reason) if done else None
            logprobs = (chat_logprobs(state.tokenizer, ev.logprobs, req.top_logprobs or 0)
                        if req.logprobs and ev.logprobs else None)
            deltas = chat_deltas(events)
            if not deltas and (logprobs or finish):
                deltas = [ChatDelta()]
            for i, delta in enumerate(deltas):
                last = i == len(deltas) - 1
                yield chunk(ev.index, delta, logprobs if i == 0 else None,
                            finish if last else None)
        if include_usage:
            usage = openai_usage(stream.choices, req.n)
            yield data_event(ChatCompletionChunk(rid, created, model, [], usage))
        yield DONE
    except Exception as exc:  # noqa: BLE001 - the stream has started: report in-band
        yield error_event(as_api_error(exc), "/v1/chat/completions")
        yield DONE
