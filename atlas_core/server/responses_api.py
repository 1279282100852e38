"""``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}`` (OpenAI Responses API).

A response runs like a chat completion (same planning, parsers and engine path); its input
items become template messages, its output is laid out as items, and unless ``store`` is false
it is kept in memory (:class:`~atlas_core.server.responses_store.ResponseStore`) so that a
later request can continue it with ``previous_response_id``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from litestar import Request, Response, delete, get, post
from litestar.params import FromPath

from atlas_core.server.agent import ChatRequest, plan_chat
from atlas_core.server.decode import read_model_request
from atlas_core.server.errors import APIError
from atlas_core.server.generation import IDLE, Choice, as_api_error
from atlas_core.server.responses_input import input_messages
from atlas_core.server.responses_output import ResponsesOutput
from atlas_core.server.responses_schemas import ResponsesRequest
from atlas_core.server.responses_store import StoredResponse
from atlas_core.server.routes import json_response
from atlas_core.server.sampling import sampling_kwargs
from atlas_core.server.sse import named_event, sse_response
from atlas_core.server.thinking import from_effort
from atlas_core.server.tools import openai_tool_choice, responses_tools
from atlas_core.server.usage import prompt_usage

PATH = "/v1/responses"


def _response_format(text: dict | None) -> dict | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return fmt
    spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": spec}


def chat_request(req: ResponsesRequest, conversation: list[dict]) -> ChatRequest:
    """The API-neutral form of a Responses request over ``conversation`` (template messages)."""
    if not conversation:
        raise APIError(400, "input is empty; send a string or a list of input items",
                       param="input")
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    tools = responses_tools(req.tools)
    return ChatRequest(
        system + conversation, tools, openai_tool_choice(req.tool_choice, tools),
        req.parallel_tool_calls is not False,
        from_effort((req.reasoning or {}).get("effort"), "reasoning.effort"),
        req.chat_template_kwargs, sampling_kwargs(req), req.max_output_tokens,
        "max_output_tokens", response_format=_response_format(req.text), format_param="text")


def response_body(req: ResponsesRequest, rid: str, created: int, model: str, output: list,
                  status: str, usage: dict | None = None) -> dict:
    """The response object (OpenAI shape) in its current state."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": rid, "object": "response", "created_at": created, "status": status,
        "model": model, "output": output, "usage": usage, "error": None,
        "incomplete_details": incomplete, "instructions": req.instructions,
        "tools": req.tools or [], "tool_choice": req.tool_choice or "auto",
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "temperature": req.temperature, "top_p": req.top_p,
        "max_output_tokens": req.max_output_tokens,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": (req.reasoning or {}).get("effort"), "summary": None},
        "text": req.text or {"format": {"type": "text"}}, "store": req.store,
        "metadata": req.metadata or {}, "truncation": "disabled", "user": req.user}


def usage_of(state, choice: Choice, output: ResponsesOutput) -> dict:
    prompt, cached = prompt_usage([choice], 1)
    reasoning = output.reasoning_text
    num_reasoning = len(state.tokenizer.encode(reasoning)) if reasoning else 0
    completion = len(choice.token_ids)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": min(num_reasoning, completion)},
            "total_tokens": prompt + completion}


class _Run:
    """One response being generated: the request, its conversation, choice and output."""

    def __init__(self, state, req: ResponsesRequest, model: str, conversation: list[dict]):
        self.state, self.req, self.model, self.conversation = state, req, model, conversation
        plan = plan_chat(state, chat_request(req, conversation))
        self.rid = state.request_id("resp_")
        self.created = int(time.time())
        self.choice = Choice(0, self.rid, plan.prompt_ids, plan.params, mm=plan.mm)
        self.shaper = state.make_chat_shaper(plan)
        self.output = ResponsesOutput()

    @property
    def status(self) -> str:
        return "incomplete" if self.choice.finish_reason == "length" else "completed"

    def body(self, status: str | None = None) -> dict:
        final = status is None
        usage = usage_of(self.state, self.choice, self.output) if final else None
        return response_body(self.req, self.rid, self.created, self.model,
                             self.output.items if final else [], status or self.status, usage)

    def finish(self) -> dict:
        """The final body; stored unless the request said ``store: false``."""
        body = self.body()
        if self.req.store:
            messages = self.conversation + input_messages(self.output.items, "output")
            self.state.responses.put(self.rid, StoredResponse(body, messages))
        return body


def _history(state, req: ResponsesRequest) -> list[dict]:
    if not req.previous_response_id:
        return []
    stored = state.responses.get(req.previous_response_id)
    if stored is None:
        raise APIError(404, f"previous response `{req.previous_response_id}` was not found: it "
                       "was created with store: false, or dropped from memory (the server keeps "
                       f"the last {state.config.max_stored_responses}; see "
                       "--max-stored-responses)", param="previous_response_id")
    return list(stored.messages)


@post(PATH, status_code=200)
async def create_response(request: Request) -> Any:
    state, req, model = await read_model_request(request, ResponsesRequest)
    conversation = _history(state, req) + input_messages(req.input)
    run = await asyncio.to_thread(_Run, state, req, model, conversation)
    if req.stream:
        stream = await state.stream([run.choice])
        return sse_response(_events(run, stream), stream)
    stream = await state.run([run.choice], receive=request.receive)
    state.raise_if_timed_out(stream)
    run.output.add(run.shaper.feed(run.choice.text))
    run.output.add(run.shaper.finish(), run.status)
    run.output.finish(run.status)
    return json_response(run.finish())


async def _events(run: _Run, stream):
    number = 0

    def send(event: dict) -> bytes:
        nonlocal number
        event["sequence_number"] = number
        number += 1
        return named_event(event["type"], event)
    yield send({"type": "response.created", "response": run.body("in_progress")})
    yield send({"type": "response.in_progress", "response": run.body("in_progress")})
    try:
        async for ev in stream:
            if ev is IDLE:
                continue
            if ev.finish_reason == "abort":
                raise APIError(504, "generation was aborted (server --request-timeout reached)")
            for event in run.output.add(run.shaper.feed(ev.text)):
                yield send(event)
        tail = run.output.add(run.shaper.finish(), run.status)
        for event in tail + run.output.finish(run.status):
            yield send(event)
        body = run.finish()
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        yield send({"type": kind, "response": body})
    except Exception as exc:  # noqa: BLE001 - the stream has started: report in-band
        err = as_api_error(exc)
        yield send({"type": "error", "code": err.code or err.type, "message": err.message,
                    "param": err.param})


def _stored(state, response_id: str):
    stored = state.responses.get(response_id)
    if stored is None:
        raise APIError(404, f"response `{response_id}` was not found (not stored, or dropped "
                       "from memory)", param="response_id", code="not_found")
    return stored


@get(f"{PATH}/{{response_id:str}}")
async def get_response(request: Request, response_id: FromPath[str]) -> Response:
    return json_response(_stored(request.app.state.atlas, response_id).body)


@delete(f"{PATH}/{{response_id:str}}", status_code=200)
async def delete_response(request: Request, response_id: FromPath[str]) -> Response:
    state = request.app.state.atlas
    _stored(state, response_id)
    state.responses.delete(response_id)
    return json_response({"id": response_id, "object": "response", "deleted": True})
