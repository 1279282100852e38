"""AsyncLLMEngine: the engine's step loop on a background thread, streamed to asyncio consumers."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Any, AsyncIterator

from atlas_core.engine.llm_engine import LLMEngine
from atlas_core.engine.outputs import EngineStats, RequestOutput
from atlas_core.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class QueueFull(RuntimeError):
    """Too many requests are waiting; retry later (HTTP 429 / 503)."""


class EngineDeadError(RuntimeError):
    """The engine loop stopped after an error; every later request fails with this."""


class RequestError(RuntimeError):
    """The engine failed while running this request; it goes on serving the others."""


class AsyncLLMEngine:
    """Runs ``engine.step()`` on its own thread, off the asyncio event loop.

    Requests enter through :meth:`generate`, an async iterator of :class:`RequestOutput` (one
    per step that produced tokens; the last has ``finished=True``). Outputs reach each
    consumer's queue with ``loop.call_soon_threadsafe``. Cancelling the consumer (a client
    disconnect) aborts the request and frees its KV blocks. A request the engine fails alone
    raises :class:`RequestError` in its consumer. When the loop itself dies (the engine raised
    from ``step``, or the thread ended), :class:`EngineDeadError` is raised in every waiting
    consumer, later requests fail with it and :attr:`errored` turns true.

    Args:
        engine: the LLMEngine (only this object's thread touches it after construction).
        max_waiting: sequences allowed to wait for a slot (beyond ``max_num_seqs`` running or
            about to run); more raise :class:`QueueFull` (default: ``engine.args.max_waiting``,
            ``None`` = unbounded).
    """

    def __init__(self, engine: LLMEngine, max_waiting: int | None = None) -> None:
        self.engine = engine
        self.max_waiting = max_waiting if max_waiting is not None else engine.args.max_waiting
        self._cond = threading.Condition()
        self._commands: deque[tuple] = deque()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._num_picked = 0
        self._stats = engine.stats()
        self._error: BaseException | None = None
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.is_warm = False
        self.last_step_time = time.monotonic()

    @property
    def errored(self) -> bool:
        """Whether the step thread died; later ``generate`` calls raise ``EngineDeadError``."""
        return self._error is not None

    @property
    def error(self) -> str | None:
        """Why the step thread died (``None`` while it runs)."""
        return None if self._error is None else f"{type(self._error).__name__}: {self._error}"

    @property
    def is_busy(self) -> bool:
        """Whether requests are queued or running (so the step thread should be making
        progress; :attr:`last_step_time` says when it last did)."""
        return bool(self._streams)

    async def warm_up(self) -> float:
        """Run a short generation so the first request pays no one-off cost (JIT compiles,
        graph captures); returns its seconds. See :func:`atlas_core.engine.health.warm_up`."""
        from atlas_core.engine.health import warm_up
        return await warm_up(self)

    async def check(self, timeout: float) -> float:
        """Generate one token through the engine within ``timeout`` seconds; returns its
        seconds. See :func:`atlas_core.engine.health.check`."""
        from atlas_core.engine.health import check
        return await check(self, timeout)

    def stats(self) -> EngineStats:
        """The engine's stats as of the last step (``is_alive``: the step thread runs)."""
        return replace(self._stats, is_alive=not self.errored)

    def start(self) -> None:
        """Start the step thread (done by the first :meth:`generate`)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="atlas-engine", daemon=True)
                self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the step thread (requests still running are left unfinished)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams,
                       mm_inputs: Any = None) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs (``mm_inputs``: see ``LLMEngine.add_request``).

        Raises:
            ValueError: the request is invalid (before anything is queued).
            QueueFull: ``max_waiting`` requests are already waiting.
            EngineDeadError: the engine loop has failed.
        """
        self.engine.validate_request(prompt_token_ids, params)
        queue: asyncio.Queue = asyncio.Queue()
        with self._cond:
            if self._error is not None:
                raise EngineDeadError(f"the engine stopped after an error ({type(self._error).__name__}; "
                                     "details in the server log)")
            if self._stopped:
                raise EngineDeadError("the engine has been shut down")
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already running; use a unique id")
            waiting = self._num_would_wait(params.n)
            if self.max_waiting is not None and waiting > self.max_waiting:
                raise QueueFull(f"{waiting - params.n} sequences are already waiting for a slot "
                                f"(max_waiting={self.max_waiting}); retry later")
            self._streams[request_id] = (asyncio.get_running_loop(), queue)
            self._commands.append(("add", request_id, list(prompt_token_ids), params, time.time(),
                                   mm_inputs))
            self._cond.notify_all()
        self.start()
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                if item.error is not None:
                    kind = item.error.split(":", 1)[0]
                    raise RequestError(f"the engine failed on request {request_id} ({kind}); "
                                       "other requests are unaffected")
                yield item
                if finished:
                    break
        finally:
            with self._cond:
                self._streams.pop(request_id, None)
                if not finished:
                    self._commands.append(("abort", request_id))
                    self._cond.notify_all()

    async def gather_together(self, coros: list) -> list:
        """Await ``coros`` (each starting one :meth:`generate`) so that the engine loop picks
        all their requests up before its next step: command pickup waits (the loop's lock is
        held; :meth:`generate` takes it again on this thread) until every one has queued its
        request. The warm-up's bucket schedule relies on one shared admission."""
        with self._cond:
            want = len(self._commands) + len(coros)
            tasks = [asyncio.ensure_future(c) for c in coros]
            for _ in range(1000):
                await asyncio.sleep(0)
                if len(self._commands) >= want or all(t.done() for t in tasks):
                    break
        return await asyncio.gather(*tasks)

    async def abort(self, request_id: str) -> None:
        """Abort a request; its stream ends with an output whose finish_reason is ``abort``."""
        with self._cond:
            self._commands.append(("abort", request_id))
            self._cond.notify_all()

    def _deliver(self, request_id: str, item) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return
        loop, queue = stream
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:
            log.debug("event loop of request %s is closed; dropping its output", request_id)

    def _forget(self, request_id: str) -> None:
        try:
            self.engine.abort_request(request_id)
        except Exception:  # noqa: BLE001 - best effort: the add that failed may have left nothing
            log.debug("cleaning up failed request %s failed too", request_id, exc_info=True)

    def _num_would_wait(self, n: int) -> int:
        # Sequences left without a slot once the engine has taken in what is queued plus ``n``
        # more; the queued ones are counted until the stats show them (caller holds the lock).
        stats = self._stats
        queued = self._num_picked + sum(c[3].n for c in self._commands if c[0] == "add")
        demand = stats.num_running + stats.num_waiting + queued + n
        return max(0, demand - self.engine.scheduler.max_num_seqs)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - every waiting request must hear of it
            log.critical("the engine loop died; failing every request", exc_info=exc)
            self._die(exc)
            return
        if not self._stopped:
            self._die(RuntimeError("the engine thread ended unexpectedly"))

    def fail(self, exc: BaseException) -> None:
        """Mark the engine dead from outside its loop (a worker of a parallel run was lost
        while idle): waiting and later requests get :class:`EngineDeadError`."""
        self._die(exc)

    def _die(self, exc: BaseException) -> None:
        with self._cond:
            self._error = exc
            for request_id in list(self._streams):
                self._deliver(request_id, EngineDeadError(f"engine step failed ({type(exc).__name__})"))

    def _loop(self) -> None:
        engine = self.engine
        while True:
            with self._cond:
                while not self._commands and not engine.has_unfinished_requests() and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                commands = list(self._commands)
                self._commands.clear()
                self._num_picked = sum(c[3].n for c in commands if c[0] == "add")
            self._apply(commands)
            outputs = engine.step() if engine.has_unfinished_requests() else []
            with self._cond:
                for out in outputs:
                    self._deliver(out.request_id, out)
                self._stats = engine.stats()
                self._num_picked = 0
                self.last_step_time = time.monotonic()

    def _apply(self, commands: list[tuple]) -> None:
        for cmd in commands:
            if cmd[0] == "add" and cmd[1] not in self._streams:
                continue
            try:
                if cmd[0] == "add":
                    _, request_id, prompt, params, arrival, mm_inputs = cmd
                    self.engine.add_request(request_id, prompt, params, arrival_time=arrival,
                                            mm_inputs=mm_inputs)
                    continue
                out = self.engine.abort_request(cmd[1])
            except ValueError as exc:
                out = exc
            except Exception as exc:  # noqa: BLE001 - one request's fault fails it alone
                log.error("request %s failed; the engine goes on", cmd[1], exc_info=exc)
                if cmd[0] == "add":
                    self._forget(cmd[1])
                out = RequestError(f"the engine failed on request {cmd[1]} "
                                   f"({type(exc).__name__}: {exc}); other requests are unaffected")
            if out is not None:
                with self._cond:
                    self._deliver(cmd[1], out)
