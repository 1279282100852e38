"""``GET /openapi.json``: the OpenAPI 3.1 document of the server, built from its msgspec schemas.

Handlers decode their bodies themselves (for errors that name the field at fault), so the
document is declared here, one :class:`Operation` per endpoint, from the same request and
response Structs the handlers use.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

import msgspec
from litestar import Request, Response, get

from atlas_core.server import anthropic_schemas as anthropic
from atlas_core.server import openai_schemas as openai
from atlas_core.server.responses_schemas import ResponsesRequest
from atlas_core.server.routes import DetokenizeRequest, TokenizeRequest

REF = "#/components/schemas/{name}"
OBJECT = {"type": "object"}
#: One server-sent event (OpenAPI 3.1: an event-stream ``schema`` describes each event).
SSE = {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"],
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}}}
#: What the request guards may answer on any endpoint (see :mod:`atlas_core.server.guards`).
GUARD_ERRORS = ("401", "403", "431")


class Operation(NamedTuple):
    """One endpoint: its path, method, summary, body and 200 response types, and whether it
    streams (``stream: true`` answers ``text/event-stream``)."""

    path: str
    method: str
    summary: str
    request: type | None = None
    response: type | dict | None = None
    streams: bool = False
    errors: tuple[str, ...] = ("400", "404", "408", "413", "415", "429", "503", "504")


MODEL_CARD = {"type": "object", "required": ["id", "object"],
              "properties": {"id": {"type": "string"}, "object": {"const": "model"},
                             "max_model_len": {"type": ["integer", "null"]}}}
MODEL_LIST = {"type": "object", "required": ["object", "data"],
              "properties": {"object": {"const": "list"},
                             "data": {"type": "array", "items": MODEL_CARD}}}
TOKENS = {"type": "object", "required": ["tokens", "count"],
          "properties": {"tokens": {"type": "array", "items": {"type": "integer"}},
                         "count": {"type": "integer"}}}
STATUS = {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}

OPERATIONS = [
    Operation("/v1/chat/completions", "post", "OpenAI chat completion",
              openai.ChatCompletionRequest, openai.ChatCompletionResponse, streams=True),
    Operation("/v1/completions", "post", "OpenAI text completion", openai.CompletionRequest,
              openai.CompletionResponse, streams=True),
    Operation("/v1/messages", "post", "Anthropic message", anthropic.MessagesRequest,
              anthropic.MessagesResponse, streams=True),
    Operation("/v1/messages/count_tokens", "post", "Anthropic token count",
              anthropic.CountTokensRequest,
              {"type": "object", "required": ["input_tokens"],
               "properties": {"input_tokens": {"type": "integer"}}}),
    Operation("/v1/responses", "post", "OpenAI Responses API", ResponsesRequest, OBJECT,
              streams=True),
    Operation("/v1/responses/{response_id}", "get", "A stored response", None, OBJECT,
              errors=("404", "503")),
    Operation("/v1/responses/{response_id}", "delete", "Delete a stored response", None, OBJECT,
              errors=("404", "503")),
    Operation("/v1/models", "get", "Served models", None, MODEL_LIST, errors=()),
    Operation("/v1/models/{model_id}", "get", "One served model", None, MODEL_CARD,
              errors=("404",)),
    Operation("/tokenize", "post", "Token ids of a prompt or conversation", TokenizeRequest,
              TOKENS),
    Operation("/detokenize", "post", "Text of token ids", DetokenizeRequest,
              {"type": "object", "required": ["prompt"],
               "properties": {"prompt": {"type": "string"}}}),
    Operation("/health", "get", "200 once the model is loaded, 503 before", None, STATUS,
              errors=("503",)),
    Operation("/health/ready", "get", "Readiness (engine alive and warm)", None, OBJECT,
              errors=("503",)),
    Operation("/health/live", "get", "200 while the process runs", None, STATUS, errors=()),
    Operation("/metrics", "get", "Prometheus metrics", None, None, errors=()),
]

OPENAI_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
ANTHROPIC_ERROR = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "error": {
        "type": "object", "required": ["type", "message"],
        "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}}}


def _struct_schemas() -> tuple[dict[type, dict], dict[str, Any]]:
    # One call for every Struct, so that msgspec names same-named Structs apart.
    kinds = list(dict.fromkeys(k for op in OPERATIONS for k in (op.request, op.response)
                               if isinstance(k, type)))
    schemas, components = msgspec.json.schema_components(kinds, ref_template=REF)
    return dict(zip(kinds, schemas)), components


def _parameters(path: str) -> list[dict]:
    names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
    return [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in names]


def _operation(op: Operation, structs: dict[type, dict]) -> dict[str, Any]:
    error = ANTHROPIC_ERROR if op.path.startswith("/v1/messages") else OPENAI_ERROR
    body = structs[op.response] if isinstance(op.response, type) else op.response
    ok: dict[str, Any] = ({"text/plain": {"schema": {"type": "string"}}} if body is None
                          else {"application/json": {"schema": body}})
    if op.streams:
        ok.update(SSE)
    responses: dict[str, Any] = {"200": {"description": "OK", "content": ok}}
    for status in (*op.errors, *GUARD_ERRORS):
        responses[status] = {"description": "error",
                             "content": {"application/json": {"schema": error}}}
    spec: dict[str, Any] = {"summary": op.summary, "operationId": _operation_id(op),
                            "responses": responses}
    if op.request is not None:
        spec["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": structs[op.request]}}}
    if _parameters(op.path):
        spec["parameters"] = _parameters(op.path)
    return spec


def _operation_id(op: Operation) -> str:
    words = [w for w in op.path.replace("{", "").replace("}", "").split("/") if w]
    return "_".join([op.method, *words]).replace(".", "_")


def _name_models(components: dict[str, Any], served: tuple[str, ...]) -> None:
    """Make every request's ``model`` field list the served names (others get a 404)."""
    for schema in components.values():
        props = schema.get("properties", {})
        if "model" not in props or not schema.get("title", "").endswith("Request"):
            continue
        names = {"enum": list(served)}
        nullable = {"type": "null"} in props["model"].get("anyOf", [])
        props["model"] = {"anyOf": [names, {"type": "null"}]} if nullable else names


@lru_cache(maxsize=4)
def openapi_bytes(served: tuple[str, ...]) -> bytes:
    """:func:`openapi_document` encoded as JSON (built once per set of names)."""
    return msgspec.json.encode(openapi_document(served))


def openapi_document(served: tuple[str, ...] = ()) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every endpoint in :data:`OPERATIONS`.

    Args:
        served: The served model names; when given, ``model`` fields list them.
    """
    structs, components = _struct_schemas()
    paths: dict[str, dict] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op, structs)
    if served:
        _name_models(components, served)
    title = f"Atlas ({served[0]})" if served else "Atlas"
    return {"openapi": "3.1.0",
            "info": {"title": title, "version": "1",
                     "description": "OpenAI- and Anthropic-compatible inference server"},
            "paths": paths, "components": {"schemas": components}}


@get("/openapi.json")
async def openapi_json(request: Request) -> Response:
    served = tuple(request.app.state.atlas.config.served_model_names)
    return Response(openapi_bytes(served), media_type="application/json")
