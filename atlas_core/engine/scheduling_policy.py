"""Scheduling policies: the order of decode rows and admissions, and each step's prefill budget.

``fifo`` keeps the scheduler's own order: running sequences round-robin, the waiting queue
first come first served, every step's prefill budget ``max_prefill_tokens``. ``slo`` (alias
``slai``, the name users of the original engine know) serves a time-between-tokens target:

* decode rows closest to their deadline (last token time + ``tbt_deadline``) go first;
* while sequences decode, prefill chunks are cut to what fits in the time left before the
  nearest deadline, from a cost model fitted to the measured step times;
* waiting prompts are admitted shortest first (then by ``priority``, lower first, as vLLM),
  except that any prompt waiting longer than the age cap goes first, oldest first, so a long
  prompt is delayed but never starved; preempted sequences keep their place at the front.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Iterable

from atlas_core.engine.sequence import Sequence

#: Names ``--scheduling-policy`` accepts, with their aliases.
POLICY_NAMES = {"fifo": "fifo", "slo": "slo", "slai": "slo"}
#: Fewest prefill tokens an slo step computes, so long prompts always advance.
MIN_PREFILL_CHUNK = 64
#: Measured step times above this multiple of the predicted one are idle gaps, not costs.
OUTLIER_FACTOR = 10.0


class StepCostModel:
    """Seconds per step as ``base + per_token * num_tokens``, least squares over recent steps.

    A step taking more than :data:`OUTLIER_FACTOR` times the prediction is not a step cost
    (the engine sat idle between two steps) and is left out.

    Args:
        window: steps kept for the fit.
    """

    def __init__(self, window: int = 256) -> None:
        self.samples: deque[tuple[int, float]] = deque(maxlen=window)

    def observe(self, num_tokens: int, seconds: float) -> None:
        if num_tokens <= 0 or seconds < 0:
            return
        coef = self.fit()
        if coef is not None and seconds > OUTLIER_FACTOR * (coef[0] + coef[1] * num_tokens):
            return
        self.samples.append((num_tokens, seconds))

    def fit(self) -> tuple[float, float] | None:
        """``(base, per_token)`` seconds, or ``None`` before any step was measured."""
        if not self.samples:
            return None
        n = len(self.samples)
        mt = sum(t for t, _ in self.samples) / n
        ms = sum(s for _, s in self.samples) / n
        var = sum((t - mt) ** 2 for t, _ in self.samples)
        if var == 0:
            return 0.0, ms / mt
        slope = sum((t - mt) * (s - ms) for t, s in self.samples) / var
        if slope <= 0:
            return ms, 0.0
        base = max(0.0, ms - slope * mt)
        return base, slope

    def tokens_within(self, seconds: float) -> int | None:
        """Most tokens one step can compute in ``seconds`` (``None``: no estimate yet)."""
        coef = self.fit()
        if coef is None or coef[1] == 0:
            return None
        return max(0, int((seconds - coef[0]) / coef[1]))


class SchedulingPolicy:
    """``fifo``: the scheduler's default order and budget. Subclasses override the hooks."""

    name = "fifo"

    def order_running(self, order: list[Sequence], now: float) -> list[Sequence]:
        """Running sequences in the order they are offered a batch row."""
        return order

    def order_waiting(self, waiting: Iterable[Sequence], now: float) -> list[Sequence] | None:
        """Waiting sequences in the order they are admitted (``None``: keep the queue's)."""
        return None

    def prefill_budget(self, budget: int, running: list[Sequence], now: float) -> int:
        """Prefill tokens this step may compute (``budget``: ``max_prefill_tokens``)."""
        return budget

    def on_step(self, scheduled: list, num_tokens: int, now: float) -> None:
        """Optional. Called once per planned step with its sequences and token count."""

    def forget(self, seq: Sequence) -> None:
        """Optional. Drop what is kept about a finished sequence."""

    @property
    def clock(self) -> Callable[[], float]:
        return time.monotonic


class SloPolicy(SchedulingPolicy):
    """Time-between-tokens aware scheduling (see the module docstring).

    Args:
        tbt_deadline_s: target seconds between two tokens of a decoding sequence.
        age_cap_s: a waiting prompt older than this is admitted before shorter ones.
        clock: seconds, monotonic (tests pass a simulated one).
    """

    name = "slo"

    def __init__(self, tbt_deadline_s: float, age_cap_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tbt_deadline_s = tbt_deadline_s
        self.age_cap_s = age_cap_s
        self._clock = clock
        self.cost = StepCostModel()
        self.last_token: dict[int, float] = {}
        self.arrival: dict[int, float] = {}
        self._last: tuple[float, int] | None = None

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    def _deadline(self, seq: Sequence, now: float) -> float:
        return self.last_token.get(seq.seq_id, now) + self.tbt_deadline_s

    def order_running(self, order, now):
        decoding = [s for s in order if not s.is_prefilling]
        prefilling = [s for s in order if s.is_prefilling]
        decoding.sort(key=lambda s: (self._deadline(s, now), s.params.priority))
        prefilling.sort(key=lambda s: (s.params.priority, s.num_uncomputed_tokens))
        return decoding + prefilling

    def order_waiting(self, waiting, now):
        seqs = list(waiting)
        for seq in seqs:
            self.arrival.setdefault(seq.seq_id, now)

        def key(seq: Sequence):
            age = now - self.arrival[seq.seq_id]
            if seq.output_token_ids:
                return 0, 0, 0, 0
            if age >= self.age_cap_s:
                return 1, -age, 0, 0
            return 2, seq.params.priority, len(seq), self.arrival[seq.seq_id]
        return sorted(seqs, key=key)

    def prefill_budget(self, budget, running, now):
        decoding = [s for s in running if not s.is_prefilling]
        if not decoding:
            return budget
        slack = min(self._deadline(s, now) for s in decoding) - now
        fits = self.cost.tokens_within(max(slack, 0.0))
        if fits is None:
            return budget
        return max(min(MIN_PREFILL_CHUNK, budget), min(budget, fits - len(decoding)))

    def on_step(self, scheduled, num_tokens, now):
        if self._last is not None:
            self.cost.observe(self._last[1], now - self._last[0])
        self._last = (now, num_tokens) if num_tokens else None
        for s in scheduled:
            self.arrival.pop(s.seq.seq_id, None)
            if s.samples:
                self.last_token[s.seq.seq_id] = now

    def forget(self, seq: Sequence) -> None:
        self.last_token.pop(seq.seq_id, None)
        self.arrival.pop(seq.seq_id, None)


def create_scheduling_policy(name: str, tbt_deadline_ms: float, age_cap_ms: float,
                             clock: Callable[[], float] = time.monotonic) -> SchedulingPolicy:
    """The policy ``--scheduling-policy`` names.

    Raises:
        ValueError: an unknown name or a non-positive deadline (the message lists the choices).
    """
    policy = POLICY_NAMES.get(str(name).lower())
    if policy is None:
        raise ValueError(f"scheduling_policy must be one of {', '.join(POLICY_NAMES)}, "
                         f"got {name!r}")
    if policy == "fifo":
        return SchedulingPolicy()
    if not tbt_deadline_ms > 0 or not age_cap_ms > 0:
        raise ValueError(f"tbt_deadline_ms and the admission age cap must be > 0, got "
                         f"{tbt_deadline_ms!r} and {age_cap_ms!r}")
    return SloPolicy(tbt_deadline_ms / 1000.0, age_cap_ms / 1000.0, clock)
