"""API errors and the two error shapes clients expect.

OpenAI clients read ``{"error": {"message", "type", "param", "code"}}``; Anthropic clients read
``{"type": "error", "error": {"type", "message"}}``. Every error a user can cause is raised as
an :class:`APIError` and rendered in the shape of the API the request was addressed to.
"""

from __future__ import annotations

import logging
import re

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException

from atlas_core.tokenizer.tokenizer import EncodeCancelled, PromptTooLong

logger = logging.getLogger("atlas.server")

_PATH = re.compile(r"""(?<![\w/:])(?:~|[A-Za-z]:)?[\\/][^\s'"`:,;)]+""")

#: Roughly how deep request JSON may nest: the decoder stops at Python's recursion limit.
MAX_JSON_DEPTH = 1000

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    431: "request_too_large",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


class APIError(Exception):
    """An error to send to the client.

    Args:
        status: HTTP status code.
        message: One line saying what was wrong and how to fix it.
        param: The request field at fault, if any (OpenAI ``param``).
        code: A short machine-readable code (OpenAI ``code``), e.g. ``"model_not_found"``.
        headers: Extra response headers, e.g. ``Retry-After``.
    """

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    @property
    def type(self) -> str:
        return ERROR_TYPES.get(self.status, "api_error")


#: Content part / block types that carry media rather than text, in any of the three APIs.
MEDIA_PARTS = {"image_url": "image", "input_image": "image", "image": "image",
               "input_audio": "audio", "audio": "audio", "file": "file", "input_file": "file",
               "document": "document", "video_url": "video", "video": "video"}


def unsupported_part(kind: object, param: str, supported: str) -> APIError:
    """The 400 for a content part this server can't take; media parts get their own message
    (the text path of vision-language checkpoints is served, their vision tower is not loaded)."""
    media = MEDIA_PARTS.get(kind) if isinstance(kind, str) else None
    if media:
        return APIError(400, f"{media} inputs are not supported here: Atlas takes images in the "
                        f"user and assistant turns of vision-language models, and no audio, video "
                        f"or files; remove the `{kind}` part or describe it in text", param=param,
                        code="unsupported_modality")
    return APIError(400, f"content part type `{kind}` is not supported (this server takes "
                    f"{supported})", param=param)


def without_paths(text: str) -> str:
    """``text`` with filesystem paths replaced by ``<path>`` (for messages clients see)."""
    return _PATH.sub("<path>", text)


def is_anthropic_path(path: str) -> bool:
    """Whether ``path`` belongs to the Anthropic Messages API (errors use its shape)."""
    return path.startswith("/v1/messages")


def error_body(exc: APIError, path: str) -> dict:
    """The JSON error object for ``exc`` in the shape of the API at ``path``."""
    if is_anthropic_path(path):
        return {"type": "error", "error": {"type": exc.type, "message": exc.message}}
    return {"error": {"message": exc.message, "type": exc.type, "param": exc.param,
                      "code": exc.code}}


def error_bytes(exc: APIError, path: str) -> bytes:
    """:func:`error_body` encoded as JSON."""
    return msgspec.json.encode(error_body(exc, path))


def error_response(exc: APIError, path: str) -> Response:
    """A litestar response carrying ``exc``."""
    return Response(content=error_bytes(exc, path), status_code=exc.status,
                    media_type="application/json", headers=exc.headers)


async def send_error(send, exc: APIError, path: str) -> None:
    """Answer an ASGI request with ``exc`` from middleware (before any route runs)."""
    body = error_bytes(exc, path)
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in exc.headers.items()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def handle_api_error(request: Request, exc: APIError) -> Response:
    return error_response(exc, request.url.path)


def handle_http_exception(request: Request, exc: HTTPException) -> Response:
    status = exc.status_code
    if status == 413:
        limit = request.route_handler.resolve_request_max_body_size()
        message = (f"request body is larger than the server limit of {limit} bytes; "
                   "send less or restart the server with a larger --max-request-body")
    elif status == 404:
        message = f"no such endpoint: {request.method} {request.url.path}"
    elif status == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return error_response(APIError(status, message, headers=exc.headers), request.url.path)


def handle_unexpected(request: Request, exc: Exception) -> Response:
    logger.exception("internal error while serving %s %s", request.method, request.url.path)
    err = APIError(500, f"internal server error ({type(exc).__name__}); see the server log")
    return error_response(err, request.url.path)


def handle_recursion(request: Request, exc: RecursionError) -> Response:
    err = APIError(400, "the request JSON is nested too deeply (the server takes up to about "
                   f"{MAX_JSON_DEPTH} levels); flatten the nested objects or arrays",
                   code="json_too_deep")
    return error_response(err, request.url.path)


def handle_prompt_too_long(request: Request, exc: PromptTooLong) -> Response:
    param = "prompt" if request.url.path in ("/v1/completions", "/tokenize") else "messages"
    err = APIError(400, f"{exc}; shorten the prompt", param=param,
                   code="context_length_exceeded")
    return error_response(err, request.url.path)


def handle_encode_cancelled(request: Request, exc: EncodeCancelled) -> Response:
    err = APIError(503, "the server is shutting down; retry against a running server")
    return error_response(err, request.url.path)


EXCEPTION_HANDLERS = {
    APIError: handle_api_error,
    RecursionError: handle_recursion,
    PromptTooLong: handle_prompt_too_long,
    EncodeCancelled: handle_encode_cancelled,
    HTTPException: handle_http_exception,
    Exception: handle_unexpected,
}
