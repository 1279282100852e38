"""Reading request bodies into msgspec Structs, with errors that name the field at fault."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec
from litestar import Request

from atlas_core.server.errors import APIError

T = TypeVar("T")

_AT_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
_MISSING = re.compile(r"missing required field `([^`]+)`")


def param_of(message: str) -> str | None:
    """The field a msgspec validation message points at, e.g. ``messages[0].role``."""
    path = _AT_PATH.search(message)
    missing = _MISSING.search(message)
    prefix = path.group(1) if path else ""
    if missing:
        return f"{prefix}.{missing.group(1)}" if prefix else missing.group(1)
    return prefix or None


def _drop_nulls(raw, schema):
    """``raw`` without top-level ``null`` values of optional fields: clients (LangChain,
    LiteLLM, JS SDKs) send ``"n": null`` or ``"stream": null`` to mean "the default"."""
    if not isinstance(raw, dict):
        return raw
    optional = {f.encode_name for f in msgspec.structs.fields(schema) if not f.required}
    return {k: v for k, v in raw.items() if v is not None or k not in optional}


def decode_body(body: bytes, schema: type[T]) -> T:
    """Decode a JSON request body into ``schema``.

    Raises:
        APIError: 400 for bad UTF-8, malformed JSON, or fields of the wrong type or value; the
            message and ``param`` name the field.
    """
    if not body.strip():
        raise APIError(400, "request body is empty; send a JSON object")
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(400, f"request body is not valid UTF-8 (bad byte at offset {exc.start})",
                       code="invalid_encoding") from None
    try:
        try:
            return msgspec.json.decode(body, type=schema)
        except msgspec.ValidationError as exc:
            if "got `null`" not in str(exc):
                raise
            return msgspec.convert(_drop_nulls(msgspec.json.decode(body), schema), schema)
    except msgspec.ValidationError as exc:
        message = str(exc)
        param = param_of(message)
        where = f" (field `{param}`)" if param and param not in message else ""
        raise APIError(400, f"invalid request: {message}{where}", param=param) from None
    except msgspec.DecodeError as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None


async def read_request(request: Request, schema: type[T]) -> T:
    """Read and decode the body of ``request`` (size limits are enforced by litestar: 413)."""
    return decode_body(await request.body(), schema)


async def read_model_request(request: Request, schema: type[T]) -> tuple[Any, T, str]:
    """The app's ``ServerState``, the decoded body and the served model name it addresses.

    The common start of every endpoint that needs the model; ``schema`` has a ``model`` field.

    Raises:
        APIError: 400 for a bad body, 404 for a model not served here, 503 while the model is
            loading or after it failed to load.
    """
    state = request.app.state.atlas
    req = await read_request(request, schema)
    model = state.resolve_model(req.model)
    state.require_engine()
    return state, req, model
