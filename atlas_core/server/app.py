"""``create_app``: the litestar application serving one engine."""

from __future__ import annotations

from typing import Any, Callable

from litestar import Litestar
from litestar.config.cors import CORSConfig
from litestar.datastructures import State

from atlas_core.server import (anthropic_messages, openai_chat, openai_completions, responses_api,
                               routes)
from atlas_core.server.access_log import RecordingMetrics, access_log_middleware
from atlas_core.server.auth import auth_middleware
from atlas_core.server.config import ServerConfig
from atlas_core.server.errors import EXCEPTION_HANDLERS, logger, without_paths
from atlas_core.server.guards import guard_middleware
from atlas_core.server.openapi import openapi_json
from atlas_core.server.state import ServerState

HANDLERS = [
    openai_chat.chat_completions, openai_completions.completions,
    anthropic_messages.messages, anthropic_messages.count_tokens,
    responses_api.create_response, responses_api.get_response, responses_api.delete_response,
    routes.list_models, routes.get_model, routes.tokenize, routes.detokenize,
    routes.health, routes.ready, routes.live, routes.metrics, openapi_json,
]


class AppState(ServerState):
    """:class:`ServerState` that records per-request numbers for the access log and makes the
    tokenizer refuse prompts that cannot fit the context before tokenizing them."""

    def __init__(self, config: ServerConfig, engine: Any = None, tokenizer: Any = None):
        super().__init__(config, engine, tokenizer=tokenizer)
        self.metrics = RecordingMetrics(self.stats)

    def fail(self, message: str) -> None:
        logger.error("the model failed to load: %s", message)
        super().fail(without_paths(message))

    def attach(self, engine: Any) -> None:
        super().attach(engine)
        limit_input = getattr(self.tokenizer, "limit_input", None)
        if limit_input is not None:
            limit_input(self.max_seq_len)


def create_app(engine: Any, config: ServerConfig, *, tokenizer: Any = None,
               loader: Callable[[], Any] | None = None) -> Litestar:
    """Build the HTTP app serving ``engine``.

    Args:
        engine: An ``AsyncLLMEngine`` (it must expose ``generate``, ``abort``, ``stats`` and a
            ``tokenizer``), or ``None`` when ``loader`` will produce one.
        config: Server settings.
        tokenizer: Overrides ``engine.tokenizer``.
        loader: Called on a worker thread at start-up to build the engine; until it returns,
            ``/health`` answers 503 and generation endpoints 503 "still loading".

    Returns:
        The app; its ``state.atlas`` is the :class:`~atlas_core.server.state.ServerState`.
    """
    state = AppState(config, engine, tokenizer=tokenizer)
    background: list = []

    async def start_loading() -> None:
        if loader is not None and state.engine is None:
            import asyncio
            background.append(asyncio.get_running_loop().create_task(state.load(loader)))

    async def shutdown() -> None:
        for task in background:
            task.cancel()
        stop = getattr(state.engine, "shutdown", None)
        if stop is not None:
            result = stop()
            if hasattr(result, "__await__"):
                await result

    middleware = [access_log_middleware] if config.access_log else []
    middleware.append(state.metrics.middleware)
    if config.api_keys:
        middleware.append(auth_middleware(config.api_keys))
    middleware.append(guard_middleware(config))
    cors = CORSConfig(allow_origins=config.allowed_origins) if config.allowed_origins else None
    return Litestar(route_handlers=HANDLERS, state=State({"atlas": state}),
                    middleware=middleware, exception_handlers=EXCEPTION_HANDLERS,
                    request_max_body_size=config.max_request_body, cors_config=cors,
                    on_startup=[start_loading], on_shutdown=[shutdown], openapi_config=None,
                    debug=False)
