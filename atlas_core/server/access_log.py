"""One access-log line per request: method, path, status, tokens, time to first token, duration.

The middleware opens a :class:`RequestRecord` in a context variable; generation code reports
into it through :class:`RecordingMetrics` (the metrics callbacks run in the request's task).
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from dataclasses import dataclass, field

from atlas_core.server.metrics import Metrics

logger = logging.getLogger("atlas.access")
current_record: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar(
    "atlas_request_record", default=None)


@dataclass
class RequestRecord:
    """What one request did, filled in while it runs."""

    start: float = field(default_factory=time.monotonic)
    prompt_tokens: dict[str, int] = field(default_factory=dict)
    completion_tokens: int = 0
    first_token: float | None = None

    def line(self, method: str, path: str, status: int, client: str) -> str:
        """The log line of this request."""
        duration_ms = (time.monotonic() - self.start) * 1000
        parts = [client, method, path, str(status)]
        if self.prompt_tokens:
            parts.append(f"prompt_tokens={sum(self.prompt_tokens.values())}")
            parts.append(f"completion_tokens={self.completion_tokens}")
        if self.first_token is not None:
            parts.append(f"ttft_ms={(self.first_token - self.start) * 1000:.0f}")
        parts.append(f"duration_ms={duration_ms:.0f}")
        return " ".join(parts)


class RecordingMetrics(Metrics):
    """:class:`Metrics` that also report tokens and first-token time to the current request."""

    def on_first_token(self, stream, choice) -> None:
        super().on_first_token(stream, choice)
        record = current_record.get()
        if record is not None and record.first_token is None:
            record.first_token = choice.first_token_time

    def on_finish(self, stream, choice) -> None:
        super().on_finish(stream, choice)
        record = current_record.get()
        if record is not None:
            record.prompt_tokens[choice.request_id] = len(choice.prompt_ids)
            record.completion_tokens += len(choice.token_ids)


def access_log_middleware(app):
    """ASGI middleware logging one line per HTTP request to the ``atlas.access`` logger."""
    async def logged(scope, receive, send):
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        record = RequestRecord()
        token = current_record.set(record)
        status = [500]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
        try:
            await app(scope, receive, send_status)
        finally:
            current_record.reset(token)
            client = scope.get("client")
            where = f"{client[0]}:{client[1]}" if client else "-"
            logger.info(record.line(scope["method"], scope["path"], status[0], where))
    return logged


def log_to_stderr() -> None:
    """Print access-log lines on standard error (``atlas serve`` does this); idempotent."""
    if any(getattr(h, "is_atlas_access", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.is_atlas_access = True
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%dT%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
