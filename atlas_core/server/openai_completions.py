"""``POST /v1/completions`` (legacy text completions; prompts as text or token ids)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
from litestar import Request, Response, post

from atlas_core.server.agent import checked_stops, resolve_max_tokens, vllm_constraint
from atlas_core.server.decode import read_model_request
from atlas_core.server.errors import APIError
from atlas_core.server.generation import IDLE, Choice, as_api_error
from atlas_core.server.logprobs import completion_logprobs, token_text
from atlas_core.server.openai_schemas import CompletionChoice, CompletionRequest, CompletionResponse
from atlas_core.server.sampling import logit_bias, make_params, sampling_kwargs, stop_list
from atlas_core.server.sse import DONE, data_event, error_event, sse_response
from atlas_core.server.usage import openai_usage


def prompt_token_lists(state, req: CompletionRequest) -> list[tuple[list[int], str | None]]:
    """Every prompt of the request as ``(token ids, text or None)`` (ids validated)."""
    prompt = req.prompt
    if isinstance(prompt, str):
        items: list = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        items = [prompt]
    else:
        items = list(prompt)
    if not items:
        raise APIError(400, "prompt is empty", param="prompt")
    lists = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            lists.append((state.tokenizer.encode(item, add_special_tokens=req.add_special_tokens),
                          item))
        elif isinstance(item, list):
            state.check_token_ids(item, f"prompt[{i}]")
            lists.append((list(item), None))
        else:
            raise APIError(400, "prompt must be a string, a list of strings, a list of token ids "
                           "or a list of token-id lists (not a mix)", param="prompt")
    return lists


def build_choices(state, req: CompletionRequest, rid: str) -> list[Choice]:
    if req.suffix:
        raise APIError(400, "suffix (fill-in-the-middle) is not supported; put all text in "
                       "prompt", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise APIError(400, "best_of is not supported; use n", param="best_of")
    if req.n > state.config.max_n:
        raise APIError(400, f"n must be <= {state.config.max_n}", param="n")
    choices = []
    stops = checked_stops(stop_list(req.stop))
    guided = vllm_constraint(req)[0]
    for p, (prompt_ids, text) in enumerate(prompt_token_lists(state, req)):
        max_tokens = resolve_max_tokens(state, len(prompt_ids), req.max_tokens or 16, "max_tokens")
        fields = sampling_kwargs(
            req, max_tokens=max_tokens, seed=req.seed, stop=stops,
            stop_token_ids=req.stop_token_ids, logit_bias=logit_bias(req.logit_bias),
            logprobs=req.logprobs, prompt_logprobs=req.logprobs if req.echo else None,
            guided=guided)
        params = make_params(fields, state.generation_defaults, req.n)
        choices.extend(Choice(p * req.n + i, f"{rid}-{p}", prompt_ids, params, output_index=i,
                              prompt_text=text) for i in range(req.n))
    return choices


def _echo_text(state, choice: Choice) -> str:
    if choice.prompt_text is not None:
        return choice.prompt_text
    return state.tokenizer.decode(choice.prompt_ids, skip_special_tokens=False)


def _logprobs(state, req: CompletionRequest, choice: Choice, entries: list, offset: int,
              with_prompt: bool):
    if req.logprobs is None:
        return None
    return completion_logprobs(state.tokenizer, entries, req.logprobs, offset,
                               prompt_entries=choice.prompt_logprobs if with_prompt else None,
                               prompt_ids=choice.prompt_ids if with_prompt else None)


@post("/v1/completions", status_code=200)
async def completions(request: Request) -> Any:
    state, req, model = await read_model_request(request, CompletionRequest)
    rid = state.request_id("cmpl-")
    choices = await asyncio.to_thread(build_choices, state, req, rid)
    if req.stream:
        stream = await state.stream(choices)
        return sse_response(_completion_events(state, req, model, rid, stream), stream)
    stream = await state.run(choices, receive=request.receive)
    result = []
    for c in choices:
        prefix = _echo_text(state, c) if req.echo else ""
        logprobs = _logprobs(state, req, c, c.logprobs, 0, req.echo)
        result.append(CompletionChoice(c.index, prefix + c.text, logprobs, c.finish_reason,
                                       c.stop_reason))
    body = CompletionResponse(rid, int(time.time()), model, result, openai_usage(choices, req.n))
    return Response(msgspec.json.encode(body), media_type="application/json")


async def _completion_events(state, req: CompletionRequest, model: str, rid: str, stream):
    created = int(time.time())
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    offsets = {c.index: 0 for c in stream.choices}
    echoed: set[int] = set()

    def chunk(choice: CompletionChoice) -> bytes:
        return data_event(CompletionResponse(rid, created, model, [choice], None))
    try:
        async for ev in stream:
            if ev is IDLE:
                continue
            choice = stream.choices[ev.index]
            text = ev.text
            with_prompt = req.echo and ev.index not in echoed
            if with_prompt:
                echoed.add(ev.index)
                text = _echo_text(state, choice) + text
            logprobs = _logprobs(state, req, choice, ev.logprobs, offsets[ev.index], with_prompt)
            offsets[ev.index] += sum(len(token_text(state.tokenizer, t)) for t in ev.token_ids)
            if text or ev.finish_reason or logprobs:
                yield chunk(CompletionChoice(ev.index, text, logprobs, ev.finish_reason,
                                             ev.stop_reason))
        if include_usage:
            yield data_event(CompletionResponse(rid, created, model, [],
                                                openai_usage(stream.choices, req.n)))
        yield DONE
    except Exception as exc:  # noqa: BLE001 - the stream has started: report in-band
        yield error_event(as_api_error(exc), "/v1/completions")
        yield DONE
