"""Driving the engine for one HTTP request: fan-out, deltas, timeouts, disconnects, abort.

A request with several prompts becomes several engine requests, run concurrently; the ``n``
choices of one prompt are the ``n`` completions of one engine request. :class:`GenerationStream`
turns their outputs into :class:`Delta` events and makes sure every engine request still running
is aborted when the HTTP request ends for any reason (client gone, timeout, error), so its KV
blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator

from atlas_core.server.errors import APIError, logger

IDLE = "idle"


def as_api_error(exc: Exception) -> APIError:
    """An engine exception as the HTTP error to send (429 queue full, 400 invalid, 503 dead)."""
    from atlas_core.engine import EngineDeadError, QueueFull, RequestError

    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RequestError):
        return APIError(500, f"{exc}; see the server log", code="engine_request_failed")
    if isinstance(exc, QueueFull):
        return APIError(429, f"the server is busy: {exc}", headers={"Retry-After": "1"})
    if isinstance(exc, EngineDeadError):
        return APIError(503, f"the engine has stopped: {exc}; restart the server")
    if isinstance(exc, ValueError):
        return APIError(400, str(exc))
    logger.error("generation failed", exc_info=exc)
    return APIError(500, f"internal server error ({type(exc).__name__}); see the server log")


@dataclass
class Choice:
    """Everything generated so far for one choice: completion ``output_index`` of engine
    request ``request_id`` (the ``n`` choices of one prompt share a request)."""

    index: int
    request_id: str
    prompt_ids: list[int]
    params: Any
    output_index: int = 0
    prompt_text: str | None = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    num_cached_tokens: int = 0
    prompt_logprobs: list | None = None
    first_token_time: float | None = None
    mm: Any = None


@dataclass
class Delta:
    """What one engine step added to one choice."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list
    finish_reason: str | None
    stop_reason: str | int | None


class GenerationStream:
    """Runs ``choices`` on ``engine`` and yields :class:`Delta` events (or :data:`IDLE`).

    Args:
        engine: An ``AsyncLLMEngine`` (``generate`` async iterator, ``abort`` coroutine).
        choices: The engine requests to run.
        metrics: Receives ``on_first_token(choice)`` and ``on_finish(choice)`` callbacks.
        timeout: Seconds before every unfinished choice is aborted; 0 means none.
        idle_interval: When set, :data:`IDLE` is yielded after this many quiet seconds.
        receive: The ASGI ``receive`` of a non-streaming request; a disconnect aborts.
    """

    def __init__(self, engine, choices: list[Choice], metrics=None, *, timeout: float = 0.0,
                 idle_interval: float | None = None, receive: Callable | None = None):
        self.engine = engine
        self.choices = choices
        self.metrics = metrics
        self.timeout = timeout
        self.idle_interval = idle_interval
        self.receive = receive
        self.timed_out = False
        self.disconnected = False
        self.stopping = False
        self.start_time = time.monotonic()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._groups: dict[str, list[Choice]] = {}
        self._early_errors: list[Exception] = []
        self._recorded: set[int] = set()
        self._closed = False

    async def _pump(self, request_id: str, choices: list[Choice]) -> None:
        first = choices[0]
        started = False
        try:
            extra = {"mm_inputs": first.mm} if first.mm is not None else {}
            async for out in self.engine.generate(request_id, first.prompt_ids, first.params,
                                                  **extra):
                started = True
                self._queue.put_nowait((request_id, out))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer to raise
            if not started:
                self._early_errors.append(exc)
            self._queue.put_nowait((request_id, exc))
        else:
            self._queue.put_nowait((request_id, None))

    async def start(self) -> None:
        """Submit every engine request; raise at once if the engine refuses one (invalid,
        queue full, engine dead) so the client gets a proper HTTP error, not a broken stream."""
        if self._tasks:
            return
        self._groups = self._requests()
        self._tasks = [asyncio.create_task(self._pump(rid, cs)) for rid, cs in self._groups.items()]
        if self.receive is not None:
            self._tasks.append(asyncio.create_task(self._watch_disconnect()))
        await asyncio.sleep(0)
        if self._early_errors:
            await self.close()
            raise self._early_errors[0]

    async def _watch_disconnect(self) -> None:
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                self._queue.put_nowait((None, None))
                return

    def _apply(self, choice: Choice, out) -> Delta | None:
        completion = out.outputs[choice.output_index]
        new_ids = list(completion.token_ids[len(choice.token_ids):])
        new_text = completion.text[len(choice.text):]
        new_logprobs = list((completion.logprobs or [])[len(choice.logprobs):])
        choice.token_ids.extend(new_ids)
        choice.text = completion.text
        choice.logprobs.extend(new_logprobs)
        choice.num_cached_tokens = out.num_cached_tokens or 0
        if getattr(out, "prompt_logprobs", None) is not None:
            choice.prompt_logprobs = out.prompt_logprobs
        if new_ids and choice.first_token_time is None:
            choice.first_token_time = time.monotonic()
            if self.metrics:
                self.metrics.on_first_token(self, choice)
        if completion.finish_reason is not None:
            choice.finish_reason = completion.finish_reason
            choice.stop_reason = completion.stop_reason
        elif not (new_ids or new_text or new_logprobs):
            return None
        return Delta(choice.index, new_text, new_ids, new_logprobs, choice.finish_reason,
                     choice.stop_reason)

    def _finish(self, choice: Choice) -> None:
        if self.metrics and choice.index not in self._recorded:
            self._recorded.add(choice.index)
            self.metrics.on_finish(self, choice)

    def _abort_delta(self, choice: Choice) -> Delta:
        choice.finish_reason = "abort"
        self._finish(choice)
        return Delta(choice.index, "", [], [], "abort", None)

    def _abort_all(self, request_ids: set[str]) -> Iterator[Delta]:
        for rid in sorted(request_ids):
            for choice in self._groups[rid]:
                if choice.finish_reason is None:
                    yield self._abort_delta(choice)

    def _next_wait(self) -> float | None:
        waits = []
        if self.idle_interval:
            waits.append(self.idle_interval)
        if self.timeout:
            waits.append(max(0.0, self.start_time + self.timeout - time.monotonic()))
        return min(waits) if waits else None

    def _requests(self) -> dict[str, list[Choice]]:
        groups: dict[str, list[Choice]] = {}
        for choice in self.choices:
            groups.setdefault(choice.request_id, []).append(choice)
        return groups

    async def __aiter__(self) -> AsyncIterator[Delta | str]:
        await self.start()
        groups = self._groups
        pending = set(groups)
        try:
            while pending:
                try:
                    rid, item = await asyncio.wait_for(self._queue.get(), self._next_wait())
                except TimeoutError:
                    if self.timeout and time.monotonic() >= self.start_time + self.timeout:
                        self.timed_out = True
                        await self.close()
                        for delta in self._abort_all(pending):
                            yield delta
                        return
                    yield IDLE
                    continue
                if rid is None:
                    await self.close()
                    for delta in self._abort_all(pending) if item == "stop" else ():
                        yield delta
                    return
                if isinstance(item, Exception):
                    raise item
                if rid not in pending:
                    continue
                for choice in groups[rid]:
                    if choice.finish_reason is not None:
                        continue
                    delta = (self._apply(choice, item) if item is not None
                             else self._abort_delta(choice))
                    if delta is not None and delta.finish_reason is not None and item is not None:
                        self._finish(choice)
                    if delta is not None:
                        yield delta
                if all(c.finish_reason is not None for c in groups[rid]):
                    pending.discard(rid)
        finally:
            await self.close()

    def stop(self) -> None:
        """End the stream now (the server is stopping): unfinished choices end with ``abort``."""
        self.stopping = True
        self._queue.put_nowait((None, "stop"))

    async def close(self) -> None:
        """Abort every unfinished engine request and stop the helper tasks. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for rid, choices in self._requests().items():
            if any(c.finish_reason is None for c in choices):
                try:
                    await self.engine.abort(rid)
                except Exception:  # noqa: BLE001 - aborting a finished request is harmless
                    pass
        for choice in self.choices:
            if choice.finish_reason is None and choice.token_ids:
                self._finish(choice)
        for task in self._tasks:
            task.cancel()

    async def collect(self) -> list[Choice]:
        """Run to completion (non-streaming use) and return the choices."""
        async for _ in self:
            pass
        return self.choices
