"""Server settings: everything the HTTP layer needs that is not the engine itself."""

from __future__ import annotations

import msgspec

DEFAULT_MAX_REQUEST_BODY = 32 * 1024 * 1024


class ServerConfig(msgspec.Struct, kw_only=True):
    """Settings of one Atlas HTTP server.

    Attributes:
        served_model_names: Names clients may put in ``model``; the first is reported in
            responses. A request naming any other model gets a 404. A request without a
            ``model`` field is served by the first name.
        api_keys: Accepted API keys (``Authorization: Bearer <key>`` or ``x-api-key``). Empty
            means no authentication. ``/health`` and ``/metrics`` are always open.
        max_request_body: Largest request body in bytes; larger bodies get a 413.
        request_timeout: Seconds a generation may run before it is aborted; 0 means no limit.
        retry_after: Seconds suggested in ``Retry-After`` while the model is loading. (A full
            queue is the engine's ``max_waiting``: such requests get a 429 with Retry-After.)
        default_chat_template_kwargs: Extra chat-template variables for every chat request
            (e.g. ``{"enable_thinking": true}``); a request's ``chat_template_kwargs`` override
            them.
        ping_interval: Seconds between Anthropic ``ping`` events on an idle stream.
        allowed_origins: CORS origins allowed to call the API from a browser; empty disables CORS.
        max_n: Largest ``n`` (choices per request) accepted.
    """

    served_model_names: list[str]
    api_keys: list[str] = msgspec.field(default_factory=list)
    max_request_body: int = DEFAULT_MAX_REQUEST_BODY
    request_timeout: float = 0.0
    retry_after: int = 1
    default_chat_template_kwargs: dict = msgspec.field(default_factory=dict)
    ping_interval: float = 10.0
    allowed_origins: list[str] = msgspec.field(default_factory=list)
    max_n: int = 16

    def __post_init__(self) -> None:
        if not self.served_model_names:
            raise ValueError("ServerConfig.served_model_names must name at least one model")
        if self.max_request_body <= 0:
            raise ValueError("ServerConfig.max_request_body must be positive")
        if self.request_timeout < 0:
            raise ValueError("ServerConfig.request_timeout must be >= 0 (0 = no limit)")

    @property
    def model_name(self) -> str:
        """The primary served model name."""
        return self.served_model_names[0]
