"""Server-sent events framing and streaming responses that always clean up."""

from __future__ import annotations

from typing import Any, AsyncIterator

import msgspec
from litestar.background_tasks import BackgroundTask
from litestar.response import Stream

from atlas_core.server.errors import APIError, error_body

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def data_event(payload: Any) -> bytes:
    """``data: {json}\\n\\n`` (OpenAI style)."""
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


def named_event(name: str, payload: Any) -> bytes:
    """``event: name\\ndata: {json}\\n\\n`` (Anthropic style)."""
    return b"event: " + name.encode() + b"\ndata: " + msgspec.json.encode(payload) + b"\n\n"


def error_event(exc: APIError, path: str) -> bytes:
    """An error inside an already-started stream, in the shape of the API at ``path``."""
    body = error_body(exc, path)
    return named_event("error", body) if path.startswith("/v1/messages") else data_event(body)


class EventStream(Stream):
    """A ``Stream`` that keeps its own media type: litestar 2.x lets the route handler's
    (JSON) media type override the response's, which sent SSE as ``application/json`` and
    broke clients that check it (Open WebUI streams only ``text/event-stream``)."""

    def to_asgi_response(self, *args: Any, **kwargs: Any):
        kwargs["media_type"] = self.media_type
        return super().to_asgi_response(*args, **kwargs)


def sse_response(events: AsyncIterator[bytes], stream) -> Stream:
    """A ``text/event-stream`` response; ``stream.close()`` runs when it ends, even when the
    client went away mid-stream (litestar runs background tasks after a disconnect too)."""
    async def cleanup() -> None:
        await events.aclose()
        await stream.close()
    return EventStream(events, media_type="text/event-stream", headers=SSE_HEADERS,
                  background=BackgroundTask(cleanup))
