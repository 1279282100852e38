"""What the engine hands back: per-request outputs, per-token logprobs, timings and stats."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


class Prefix(Sequence):
    """The first ``n`` items of an append-only list, without copying them.

    A running request's outputs hand these out step after step, so streaming a long completion
    costs each step only what it added (a list copy every step would make it quadratic).
    Compares equal to a list or tuple of the same items; ``list(prefix)`` copies.
    """

    __slots__ = ("_items", "_n")

    def __init__(self, items: list, n: int | None = None) -> None:
        self._items, self._n = items, len(items) if n is None else n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._n)
            return self._items[start:stop:step] if step > 0 else self._items[:self._n][index]
        if not -self._n <= index < self._n:
            raise IndexError("Prefix index out of range")
        return self._items[index % self._n]

    def __iter__(self):
        return iter(self._items[:self._n]) if self._n < len(self._items) else iter(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, Prefix)):
            return len(other) == self._n and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return repr(self._items[:self._n])


@dataclass
class TokenLogprob:
    """Log-probability of one token and the top alternatives at its position.

    Attributes:
        token_id: the chosen (or prompt) token.
        logprob: its log-probability under the model's distribution (before temperature).
        top: ``[(token_id, logprob), ...]`` of the most likely tokens, best first.
    """

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class RequestMetrics:
    """Wall-clock timestamps (``time.time()`` seconds) of one request's life."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None

    @property
    def time_to_first_token(self) -> float | None:
        """Seconds from arrival to the first generated token."""
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass
class CompletionOutput:
    """One completion of a request (``n`` of them per request).

    ``token_ids``, ``text`` and ``logprobs`` hold everything so far (while the request runs,
    ``token_ids`` / ``logprobs`` are :class:`Prefix` views; lists once it has finished);
    ``new_token_ids`` and ``new_text`` only what this step added (for streaming). ``text`` never contains a partial
    UTF-8 character nor text that might still turn out to start a stop string.
    """

    index: int
    token_ids: Sequence[int]
    text: str
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
    logprobs: Sequence[TokenLogprob] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        """Whether this completion has ended (``finish_reason`` is set)."""
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """State of one request after an engine step.

    Attributes:
        request_id: the id given to ``add_request``.
        prompt_token_ids: the prompt.
        outputs: one :class:`CompletionOutput` per completion, by index.
        finished: every completion has finished.
        num_cached_tokens: prompt tokens served from the prefix cache.
        metrics: timestamps.
        prompt_logprobs: per prompt token (``None`` for the first), when asked for.
        prompt: the prompt text, when the caller gave text (set by :class:`~atlas_core.LLM`).
        error: why the engine failed this request (its completions end with
            ``finish_reason="error"``); ``None`` otherwise.
    """

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int
    metrics: RequestMetrics
    prompt_logprobs: list[TokenLogprob | None] | None = None
    prompt: str | None = None
    error: str | None = None


@dataclass
class EngineStats:
    """Counters and gauges of an engine (for ``/metrics`` and logs)."""

    num_running: int = 0
    num_waiting: int = 0
    num_kv_blocks_used: int = 0
    num_kv_blocks_total: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_queries: int = 0
    num_preemptions: int = 0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_steps: int = 0
    num_failed_requests: int = 0
    is_alive: bool = True
    #: decode-step timings (:class:`~atlas_core.engine.step_timing.DecodeStepSnapshot`), or None
    decode_steps: Any = None
    #: per-tier counters of the KV tiers (:meth:`~atlas_core.engine.kv_tiers.KVTiers.stats`)
    kv_tiers: dict = field(default_factory=dict)
    #: speculative decoding counters (:class:`~atlas_core.engine.spec.SpecStats`), or None
    speculative: Any = None

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of KV blocks in use."""
        return self.num_kv_blocks_used / self.num_kv_blocks_total if self.num_kv_blocks_total else 0.0

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Cached prompt tokens / prompt tokens looked up."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
