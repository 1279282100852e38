"""Decode step timing against the floor: the fewest bytes a decode step must move.

:class:`StepBytes` counts what a loaded model actually reads per step (its parameters in their
stored formats, the experts a batch can touch, the KV cache in its dtype, recurrent state read
and written); :class:`DecodeStepTimer` records the engine's decode step times against it, and
``engine.stats()`` carries them (``EngineStats.decode_steps``) to ``/metrics``. The bandwidth
comes from :func:`atlas_core.bench.floor.floor_line` at start-up.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from atlas_core.engine.outputs import EngineStats

STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03,
                0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
#: Decode steps averaged by :attr:`DecodeStepSnapshot.floor_fraction`.
FLOOR_WINDOW = 64


class StepBytes:
    """Bytes one decode step of ``model`` must read (and write, for recurrent state).

    Args:
        model: a materialized CausalLM (parameters allocated; quantized ones in their format).
        kv_config: the engine's :class:`~atlas_core.engine.kv_sizing.KVCacheConfig`.
    """

    def __init__(self, model: Any, kv_config: Any) -> None:
        self.dense = self.embed_row = 0
        self.experts: list[tuple[int, int, int]] = []  # (bytes, num_experts, top_k)
        #: Ranks the batch's expert picks spread over (expert parallelism: each rank holds
        #: ``num_experts / ranks`` whole experts and takes an even share of the picks).
        self.expert_share = 1
        tied = bool(getattr(model, "tie_word_embeddings", False))
        named = model.named_specs() if hasattr(model, "named_specs") else ()
        for name, module, local, spec in named:
            array = getattr(module, "params", {}).get(local)
            nbytes = int(getattr(array, "nbytes", 0))
            if name.endswith("embed_tokens.weight") and not tied and spec.shape:
                self.embed_row = nbytes // spec.shape[0]
            elif ".experts." in f".{local}" and hasattr(module, "top_k"):
                self.experts.append((nbytes, spec.shape[0], module.top_k))
            else:
                self.dense += nbytes
        self.kv_per_token = kv_config.bytes_per_block // max(1, kv_config.block_size)
        self.state_per_seq = 2 * getattr(kv_config, "state_bytes_per_slot", 0)
        pool = getattr(kv_config, "window_pool", None)
        # sliding-window layers read at most their window of each sequence's context
        self.window = pool.window if pool is not None else 0
        self.window_per_token = (pool.bytes_per_block // max(1, kv_config.block_size)
                                 if pool is not None else 0)

    def __call__(self, batch: int, context_tokens: int) -> int:
        """Bytes of one step over ``batch`` sequences holding ``context_tokens`` tokens in all."""
        experts = sum(nbytes * min(n, -(-batch * k // self.expert_share)) // n
                      for nbytes, n, k in self.experts)
        window = batch * min(context_tokens // max(1, batch), self.window)
        return (self.dense + experts + batch * (self.embed_row + self.state_per_seq)
                + context_tokens * self.kv_per_token + window * self.window_per_token)


@dataclass(frozen=True)
class DecodeStepSnapshot:
    """Cumulative decode-step histogram and the recent fraction of the floor reached.

    Attributes:
        buckets: ``(upper bound in seconds, steps at or below it)``, cumulative, ending at inf.
        count: decode steps timed.
        total_seconds: their summed duration.
        floor_fraction: floor time / measured time over the last :data:`FLOOR_WINDOW` steps
            (``None`` while the bandwidth is unknown or no step was timed).
    """

    buckets: tuple[tuple[float, int], ...]
    count: int
    total_seconds: float
    floor_fraction: float | None


class DecodeStepTimer:
    """Times the engine's decode steps: the interval between two consecutive completed steps
    that were both decode-only (the cadence a stream sees, also under async scheduling)."""

    def __init__(self, model: Any, kv_config: Any, bandwidth_gbs: float | None = None) -> None:
        self.step_bytes = StepBytes(model, kv_config)
        self.bandwidth_gbs = bandwidth_gbs
        self._counts = [0] * (len(STEP_BUCKETS) + 1)
        self._sum = 0.0
        self._recent: deque[tuple[float, int]] = deque(maxlen=FLOOR_WINDOW)
        self._last: float | None = None
        self._lock = threading.Lock()

    def on_complete(self, sched: Any) -> None:
        """Record a completed step (a :class:`~atlas_core.engine.scheduler.SchedulerOutput`)."""
        now = time.perf_counter()
        last, self._last = self._last, (now if sched.is_decode_only else None)
        if last is None or self._last is None:
            return
        seconds = now - last
        context = sum(s.start + s.num_tokens for s in sched.scheduled)
        nbytes = self.step_bytes(len(sched.scheduled), context)
        with self._lock:
            self._counts[bisect.bisect_left(STEP_BUCKETS, seconds)] += 1
            self._sum += seconds
            self._recent.append((seconds, nbytes))

    def snapshot(self) -> DecodeStepSnapshot:
        """The histogram so far and the floor fraction of the recent steps."""
        with self._lock:
            counts, total, recent = list(self._counts), self._sum, list(self._recent)
        cumulative, running = [], 0
        for bound, n in zip((*STEP_BUCKETS, float("inf")), counts):
            running += n
            cumulative.append((bound, running))
        fraction = None
        if self.bandwidth_gbs and recent:
            floor = sum(b for _, b in recent) / (self.bandwidth_gbs * 1e9)
            fraction = floor / sum(s for s, _ in recent)
        return DecodeStepSnapshot(tuple(cumulative), running, total, fraction)

    def annotate(self, stats: EngineStats) -> EngineStats:
        """``stats`` with ``decode_steps`` set to :meth:`snapshot`."""
        return replace(stats, decode_steps=self.snapshot())
