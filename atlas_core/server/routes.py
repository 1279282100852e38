"""Small endpoints: models, tokenize / detokenize, health and metrics."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from litestar import Request, Response, get, post, route
from litestar.params import FromPath

from atlas_core.server.decode import read_model_request
from atlas_core.server.errors import APIError
from atlas_core.server.metrics import CONTENT_TYPE
from atlas_core.server.openai_schemas import ChatMessage
from atlas_core.server.prompts import openai_messages, render_chat


class TokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    tokens: list[int]
    model: str | None = None
    skip_special_tokens: bool = False


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(payload), status_code=status,
                    media_type="application/json")


def _model_card(state, name: str) -> dict[str, Any]:
    defaults = dict(state.generation_defaults)
    presets = defaults.pop("presets", None) or {}
    return {"id": name, "object": "model", "created": state.created, "owned_by": "atlas",
            "root": state.config.model_name, "parent": None, "max_model_len": state.max_seq_len,
            "sampling_defaults": defaults, "sampling_presets": presets}


@get("/v1/models")
async def list_models(request: Request) -> Response:
    state = request.app.state.atlas
    cards = [_model_card(state, name) for name in state.config.served_model_names]
    return json_response({"object": "list", "data": cards})


@get("/v1/models/{model_id:path}")
async def get_model(request: Request, model_id: FromPath[str]) -> Response:
    state = request.app.state.atlas
    name = model_id[1:] if model_id.startswith("/") else model_id
    served = state.config.served_model_names
    if name not in served and f"/{name}" in served:
        name = f"/{name}"  # a local path served as named: the router folds its "//"
    return json_response(_model_card(state, state.resolve_model(name)))


@post("/tokenize", status_code=200)
async def tokenize(request: Request) -> Response:
    state, req, _ = await read_model_request(request, TokenizeRequest)
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "send exactly one of `prompt` (text) or `messages` (a conversation)",
                       param="prompt")
    if req.prompt is not None:
        state.tokenizer.check_input_size(len(req.prompt))
        ids = await asyncio.to_thread(state.tokenizer.encode, req.prompt,
                                      add_special_tokens=req.add_special_tokens)
    else:
        kwargs = {**state.config.default_chat_template_kwargs, **(req.chat_template_kwargs or {})}
        ids = await asyncio.to_thread(
            render_chat, state.tokenizer, openai_messages(req.messages), tools=req.tools,
            add_generation_prompt=req.add_generation_prompt, template_kwargs=kwargs)
    return json_response({"tokens": ids, "count": len(ids), "max_model_len": state.max_seq_len})


@post("/detokenize", status_code=200)
async def detokenize(request: Request) -> Response:
    state, req, _ = await read_model_request(request, DetokenizeRequest)
    state.check_token_ids(req.tokens, "tokens")
    text = state.tokenizer.decode(req.tokens, skip_special_tokens=req.skip_special_tokens)
    return json_response({"prompt": text})


@route("/health", http_method=["GET", "HEAD"])
async def health(request: Request) -> Response:
    code, body = request.app.state.atlas.health()
    return json_response(body, code)


#: Longest ``timeout`` a deep readiness check may ask for, in seconds.
MAX_READY_TIMEOUT = 300.0


@get("/health/ready")
async def ready(request: Request) -> Response:
    """Readiness: ``/health`` plus engine liveness and warm state; with ``deep=1`` also one
    generated token through the engine within ``timeout`` seconds (default 30)."""
    state = request.app.state.atlas
    deep = request.query_params.get("deep", "0").lower() in ("1", "true", "yes")
    if not deep:
        code, body = state.readiness()
        return json_response(body, code)
    raw = request.query_params.get("timeout", "30")
    try:
        timeout = float(raw)
    except ValueError:
        timeout = -1.0
    if not 0 < timeout <= MAX_READY_TIMEOUT:
        raise APIError(400, f"timeout must be a number of seconds in (0, {MAX_READY_TIMEOUT:g}], "
                       f"got {raw!r}", param="timeout")
    code, body = await state.deep_readiness(timeout)
    return json_response(body, code)


@get("/health/live")
async def live(request: Request) -> Response:
    return json_response({"status": "ok"})


@get("/metrics")
async def metrics(request: Request) -> Response:
    state = request.app.state.atlas
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)
