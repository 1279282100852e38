"""Per-app server state: the engine (once loaded), tokenizer, limits, admission and ids."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import weakref
from typing import Any, Callable

from atlas_core.server.config import ServerConfig
from atlas_core.server.errors import APIError
from atlas_core.server.generation import GenerationStream, as_api_error
from atlas_core.server.metrics import Metrics
from atlas_core.server.responses_store import ResponseStore
from atlas_core.server.sampling import invalid_param
from atlas_core.server.shaping import OutputShaper

logger = logging.getLogger("atlas.server")


def engine_attr(engine: Any, *names: str, default: Any = None) -> Any:
    """Look ``names`` up on an async engine, then on the sync engine it wraps."""
    for obj in (engine, getattr(engine, "engine", None)):
        for name in names:
            value = getattr(obj, name, None) if obj is not None else None
            if value is not None:
                return value
    return default


def choose_parsers(config: ServerConfig, chat_template: str | None, model_type: str | None
                   ) -> tuple[type | None, type | None]:
    """The tool-call and reasoning parser classes the server uses (``"auto"``: per model)."""
    from atlas_core.parsers import (default_reasoning_parser_for, default_tool_parser_for,
                                    get_reasoning_parser, get_tool_parser)
    tool, reasoning = config.tool_call_parser, config.reasoning_parser
    if tool == "auto":
        tool = default_tool_parser_for(model_type, chat_template)
    if reasoning == "auto":
        reasoning = default_reasoning_parser_for(chat_template)
    if tool or reasoning:
        logger.info("output parsers: tool calls %s, reasoning %s", tool, reasoning)
    return (get_tool_parser(tool) if tool else None,
            get_reasoning_parser(reasoning) if reasoning else None)


class ServerState:
    """What every handler shares. ``engine`` is ``None`` until the model has loaded.

    Args:
        config: The server settings.
        engine: An ``AsyncLLMEngine`` (or anything with its ``generate``/``abort``/``stats`` and
            a ``tokenizer``), or ``None`` while loading.
        tokenizer: Overrides ``engine.tokenizer``.
    """

    def __init__(self, config: ServerConfig, engine: Any = None, tokenizer: Any = None):
        self.config = config
        self.engine: Any = None
        self.tokenizer = tokenizer
        self.max_seq_len: int | None = None
        self.vocab_size: int | None = None
        self.load_error: str | None = None
        self.is_warming = False
        self.engine_died_at: float | None = None
        self.warm_up_error: str | None = None
        self.created = int(time.time())
        self.metrics = Metrics(self.stats)
        self.generation_defaults: dict[str, Any] = {}
        self.tool_parser_cls: type | None = None
        self.mm_processor: Any = None
        self.reasoning_parser_cls: type | None = None
        self.responses = ResponseStore(config.max_stored_responses)
        self.live_streams: weakref.WeakSet[GenerationStream] = weakref.WeakSet()
        if engine is not None:
            self.attach(engine)

    def attach(self, engine: Any) -> None:
        """Start serving with ``engine`` (called once the model has loaded)."""
        self.tokenizer = self.tokenizer or engine_attr(engine, "tokenizer")
        if self.tokenizer is None:
            raise ValueError("the engine has no tokenizer; pass one to create_app(tokenizer=...)")
        self.max_seq_len = engine_attr(engine, "max_seq_len", "max_model_len")
        model_vocab = getattr(engine_attr(engine, "model"), "vocab_size", None)
        self.vocab_size = int(model_vocab or self.tokenizer.vocab_size)
        self.generation_defaults = dict(engine_attr(engine, "generation_defaults", default={}))
        model_config = getattr(engine_attr(engine, "model"), "config", None)
        model_type = model_config.get("model_type") if isinstance(model_config, dict) else None
        self.tool_parser_cls, self.reasoning_parser_cls = choose_parsers(
            self.config, getattr(self.tokenizer, "chat_template", None), model_type)
        # vision-language models offer one (atlas_core.server.media); text models don't
        self.mm_processor = getattr(engine_attr(engine, "model"), "mm_processor", None)
        self.engine = engine

    def make_chat_shaper(self, plan: Any) -> OutputShaper:
        """The output shaper of one choice of ``plan`` (a ``ChatPlan``); replaceable."""
        return OutputShaper(plan.parse)

    def fail(self, message: str) -> None:
        """Record that loading failed (``/health`` reports it)."""
        self.load_error = message

    async def load(self, loader: Callable[[], Any]) -> None:
        """Run ``loader`` on a worker thread, attach the engine it returns and warm it up."""
        try:
            self.is_warming = True
            self.attach(await asyncio.to_thread(loader))
        except Exception as exc:  # noqa: BLE001 - reported through /health and the log
            self.is_warming = False
            logger.debug("model failed to load", exc_info=exc)
            self.fail(str(exc) or type(exc).__name__)
            return
        await self.warm_up()

    async def warm_up(self) -> None:
        """Run the engine's ``warm_up`` (when it has one) before ``/health`` reports ready, so
        the first request is as fast as the next ones; a failure is reported as a load error."""
        warm_up = getattr(self.engine, "warm_up", None)
        self.is_warming = warm_up is not None
        if warm_up is None:
            return
        try:
            seconds = await warm_up()
            logger.info("warm-up generation done in %.1f s", seconds)
        except Exception as exc:  # noqa: BLE001 - reported through /health and the log
            logger.error("warm-up generation failed", exc_info=exc)
            self.warm_up_error = f"the warm-up generation failed: {type(exc).__name__}: {exc}"
            self.engine_died_at = time.monotonic()
            self.fail(self.warm_up_error)
        finally:
            self.is_warming = False

    @property
    def engine_error(self) -> str | None:
        """Why the engine loop died (``None`` while it runs or before it is loaded)."""
        if self.engine is None or not getattr(self.engine, "errored", False):
            return None
        if self.engine_died_at is None:
            self.engine_died_at = time.monotonic()
        error = getattr(self.engine, "error", None)
        return (f"{error.split(':', 1)[0]} (details in the server log)" if error
                else "the engine loop stopped")

    @property
    def is_ready(self) -> bool:
        """Loaded, warmed up and with a live engine loop (``/health`` answers 200)."""
        return (self.engine is not None and not self.is_warming and self.load_error is None
                and self.engine_error is None)

    def health(self) -> tuple[int, dict[str, Any]]:
        """``(status code, body)`` of ``GET /health``: 200 only when :attr:`is_ready`."""
        if self.load_error:
            return 503, {"status": "error", "message": self.load_error}
        if self.engine is None:
            return 503, {"status": "loading"}
        dead = self.engine_error
        if dead is not None:
            return 503, {"status": "error", "message": f"the engine stopped: {dead}; the server "
                         "is shutting down (restart it)"}
        if self.is_warming:
            return 503, {"status": "warming up"}
        return 200, {"status": "ok", "model": self.config.model_name}

    def readiness(self) -> tuple[int, dict[str, Any]]:
        """``(status code, body)`` of ``GET /health/ready`` without ``deep``: :meth:`health`
        plus the engine loop's liveness and warm state, from what is already known."""
        code, body = self.health()
        engine = self.engine
        if engine is not None:
            last = getattr(engine, "last_step_time", None)
            body["engine"] = "dead" if self.engine_error else "running"
            body["warm"] = bool(getattr(engine, "is_warm", not self.is_warming))
            body["busy"] = bool(getattr(engine, "is_busy", False))
            if last is not None:
                body["seconds_since_last_step"] = round(time.monotonic() - last, 3)
        return code, body

    async def deep_readiness(self, timeout: float) -> tuple[int, dict[str, Any]]:
        """:meth:`readiness`, then (when that is 200) one generated token through the engine
        within ``timeout`` seconds; 503 naming the failure when it errors or runs late."""
        code, body = self.readiness()
        check = getattr(self.engine, "check", None)
        if code != 200 or check is None:
            return code, body
        try:
            body["seconds"] = round(await check(timeout), 3)
        except TimeoutError:
            return 503, {**body, "status": "error", "message": f"no token within {timeout:g} s: "
                         "the engine is stuck or overloaded"}
        except Exception as exc:  # noqa: BLE001 - the probe's failure is the answer
            return 503, {**body, "status": "error",
                         "message": f"a one-token generation failed: {type(exc).__name__}: {exc}"}
        return 200, body

    @property
    def exit_reason(self) -> str | None:
        """Why the server must stop (the engine loop died or the warm-up generation failed);
        ``None`` while it can serve."""
        if self.warm_up_error:
            return self.warm_up_error
        if self.engine_error is None:
            return None
        return f"the engine stopped: {getattr(self.engine, 'error', None) or 'its loop ended'}"

    def should_exit(self, grace: float = 5.0) -> bool:
        """Whether the server should stop now for :attr:`exit_reason`: once the open
        generations have ended (they get the error first), or ``grace`` seconds after."""
        if self.exit_reason is None:
            return False
        return not self.live_streams or time.monotonic() - self.engine_died_at > grace

    def require_engine(self) -> Any:
        """The engine, or a 503 saying why there is none yet."""
        if self.engine is not None:
            return self.engine
        if self.load_error:
            raise APIError(503, f"the model failed to load: {self.load_error}")
        raise APIError(503, "the model is still loading; retry when GET /health returns 200",
                       headers={"Retry-After": str(self.config.retry_after)})

    def stats(self) -> Any:
        return self.engine.stats() if self.engine is not None else None

    def resolve_model(self, name: str | None) -> str:
        """The served name a request addressed; 404 for any other model."""
        if name is None or name == "":
            return self.config.model_name
        if name in self.config.served_model_names:
            return name
        served = ", ".join(self.config.served_model_names)
        raise APIError(404, f"model `{name}` is not served here; available: {served}",
                       param="model", code="model_not_found")

    def raise_if_timed_out(self, stream: GenerationStream) -> None:
        """504 when a non-streaming generation ran past ``--request-timeout``."""
        if stream.timed_out:
            raise APIError(504, f"generation timed out after {self.config.request_timeout:g} s "
                           "(server --request-timeout)")

    def request_id(self, prefix: str) -> str:
        return f"{prefix}{secrets.token_hex(12)}"

    def check_token_ids(self, ids: list[int], param: str) -> None:
        """400 unless every id is a token of this model."""
        for position, token_id in enumerate(ids):
            if not 0 <= token_id < self.vocab_size:
                raise APIError(400, f"token id {token_id} at {param}[{position}] is out of range "
                               f"[0, {self.vocab_size})", param=param, code="invalid_token_id")

    def resolve_max_tokens(self, num_prompt: int, max_tokens: int | None, param: str) -> int:
        """The generation budget; 400 (with the numbers) when prompt + max_tokens exceed the
        context."""
        if num_prompt == 0:
            raise APIError(400, "the prompt is empty; send at least one token", param="prompt")
        limit = self.max_seq_len
        if limit is None:
            return max_tokens or 16
        if max_tokens is None:
            if num_prompt >= limit:
                raise APIError(400, f"the prompt has {num_prompt} tokens but this model's context "
                               f"is {limit} tokens; shorten the prompt", param="messages",
                               code="context_length_exceeded")
            return limit - num_prompt
        if num_prompt + max_tokens > limit:
            raise APIError(400, f"the prompt ({num_prompt} tokens) plus {param} ({max_tokens}) is "
                           f"{num_prompt + max_tokens} tokens, over this model's context of "
                           f"{limit} "
                           f"tokens; lower {param} or shorten the prompt", param=param,
                           code="context_length_exceeded")
        return max_tokens

    def _stream(self, choices: list, **kwargs) -> GenerationStream:
        engine = self.require_engine()
        validate = engine_attr(engine, "validate_request")
        if validate is not None:
            seen = set()
            for choice in choices:
                if choice.request_id not in seen:
                    seen.add(choice.request_id)
                    try:
                        validate(choice.prompt_ids, choice.params)
                    except ValueError as exc:
                        raise invalid_param(exc) from None
        stream = GenerationStream(engine, choices, self.metrics,
                                  timeout=self.config.request_timeout, **kwargs)
        self.live_streams.add(stream)
        return stream

    def stop_streams(self) -> None:
        """End every open generation (server shutdown) so its response completes at once."""
        for stream in list(self.live_streams):
            stream.stop()

    async def stream(self, choices: list, *, idle_interval: float | None = None
                     ) -> GenerationStream:
        """A started :class:`GenerationStream` over ``choices`` (for SSE responses).

        Raises:
            APIError: the engine refused a request (400 invalid, 429 queue full, 503 dead).
        """
        stream = self._stream(choices, idle_interval=idle_interval)
        try:
            await stream.start()
        except Exception as exc:  # noqa: BLE001 - mapped to an HTTP status
            raise as_api_error(exc) from None
        return stream

    async def run(self, choices: list, receive=None) -> GenerationStream:
        """Run ``choices`` to completion (non-streaming); a client disconnect aborts them.

        Raises:
            APIError: as :meth:`stream`, or the engine failed mid-way.
        """
        stream = self._stream(choices, receive=receive)
        try:
            await stream.collect()
        except Exception as exc:  # noqa: BLE001 - mapped to an HTTP status
            raise as_api_error(exc) from None
        finally:
            await stream.close()
        return stream
