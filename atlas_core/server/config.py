"""Server settings: everything the HTTP layer needs that is not the engine itself."""

from __future__ import annotations

import msgspec

DEFAULT_MAX_REQUEST_BODY = 32 * 1024 * 1024
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


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
        allowed_origins: Browser origins allowed to call the API (CORS, and the cross-site check:
            without API keys, a request whose ``Origin`` is neither listed nor the server itself
            gets a 403); ``*`` allows any. Empty disables CORS.
        allowed_hosts: ``Host`` names the server answers to without API keys (a DNS-rebinding
            guard); ``*`` allows any. ``atlas serve`` adds the bind address.
        header_timeout: Seconds a client may take to send the request headers (then 408).
        body_timeout: Seconds a client may take to send the request body (then 408).
        max_header_bytes: Largest request head (request line + headers); larger gets a 431.
        access_log: Log one line per request to the ``atlas.access`` logger.
        max_n: Largest ``n`` (choices per request) accepted.
        tool_call_parser: Tool-call format of the model's output (a name from
            ``atlas_core.parsers.TOOL_PARSERS``); ``"auto"`` picks the model's default from its
            chat template and ``model_type``; ``None`` leaves tool-call markup in the content.
        reasoning_parser: Reasoning format (a name from ``REASONING_PARSERS``); ``"auto"`` uses
            ``think`` when the chat template has ``<think>`` blocks; ``None`` disables it.
        default_thinking: ``enable_thinking`` for requests that do not choose (``None``: the
            chat template's own default).
        disable_thinking: Render every prompt with ``enable_thinking`` false, whatever the
            request asks (output parsing is unchanged).
        reasoning_budget: Default most tokens of a think block (``None``: no limit); a
            request's budget (Anthropic ``budget_tokens``, ``reasoning_effort``) overrides it.
        max_stored_responses: Responses API results kept in memory for
            ``previous_response_id`` and ``GET /v1/responses/{id}`` (least recently used
            dropped first); 0 stores none.
        strict_max_tokens: Answer a ``max_tokens`` larger than the room the context has left
            with a 400; by default it is lowered to that room (finish reason ``length``).
        allowed_media_domains: Hosts whose ``http(s)`` image URLs the server fetches (their
            subdomains too; ``*`` for any); empty (the default) fetches none: images come
            inline as ``data:`` URLs or base64.
        media_fetch_timeout: Seconds an image URL fetch may take.
        max_image_bytes: Largest encoded image accepted (inline or fetched).
        max_images_per_request: Most images in one request.
    """

    served_model_names: list[str]
    api_keys: list[str] = msgspec.field(default_factory=list)
    max_request_body: int = DEFAULT_MAX_REQUEST_BODY
    request_timeout: float = 0.0
    retry_after: int = 1
    default_chat_template_kwargs: dict = msgspec.field(default_factory=dict)
    ping_interval: float = 10.0
    allowed_origins: list[str] = msgspec.field(default_factory=list)
    allowed_hosts: list[str] = msgspec.field(
        default_factory=lambda: list(LOCAL_HOSTS))
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    max_header_bytes: int = 64 * 1024
    access_log: bool = True
    max_n: int = 16
    tool_call_parser: str | None = "auto"
    reasoning_parser: str | None = "auto"
    default_thinking: bool | None = None
    disable_thinking: bool = False
    reasoning_budget: int | None = None
    max_stored_responses: int = 1000
    strict_max_tokens: bool = False
    allowed_media_domains: list[str] = msgspec.field(default_factory=list)
    media_fetch_timeout: float = 10.0
    max_image_bytes: int = 20 * 1024 * 1024
    max_images_per_request: int = 8

    def __post_init__(self) -> None:
        if not self.served_model_names:
            raise ValueError("ServerConfig.served_model_names must name at least one model")
        if self.max_request_body <= 0:
            raise ValueError("ServerConfig.max_request_body must be positive")
        if self.header_timeout <= 0 or self.body_timeout <= 0:
            raise ValueError("ServerConfig.header_timeout and body_timeout must be positive")
        if self.max_header_bytes < 1024:
            raise ValueError("ServerConfig.max_header_bytes must be at least 1024")
        if self.request_timeout < 0:
            raise ValueError("ServerConfig.request_timeout must be >= 0 (0 = no limit)")
        if self.reasoning_budget is not None and self.reasoning_budget < 0:
            raise ValueError("ServerConfig.reasoning_budget must be >= 0 (or None: no limit)")
        if self.max_stored_responses < 0:
            raise ValueError("ServerConfig.max_stored_responses must be >= 0")
        if self.media_fetch_timeout <= 0 or self.max_image_bytes <= 0:
            raise ValueError("ServerConfig.media_fetch_timeout and max_image_bytes must be "
                             "positive")
        if self.max_images_per_request < 0:
            raise ValueError("ServerConfig.max_images_per_request must be >= 0 (0: no images)")
        from atlas_core.parsers import get_reasoning_parser, get_tool_parser
        if self.tool_call_parser not in (None, "auto"):
            get_tool_parser(self.tool_call_parser)
        if self.reasoning_parser not in (None, "auto"):
            get_reasoning_parser(self.reasoning_parser)

    @property
    def model_name(self) -> str:
        """The primary served model name."""
        return self.served_model_names[0]
