"""Scheduling policies: the order of decode rows and admissions, and each step's prefill budget.

``fifo`` keeps the scheduler's own order: running sequences round-robin, the waiting queue
first come first served, every step's prefill budget ``max_prefill_tokens``. ``slo`` (alias
``slai``, the name users of the original engine know) serves a time-between-tokens target:

* decode rows closest to their deadline (the end of the step that gave their last token +
  ``tbt_deadline``) go first;
* while sequences decode, prefill chunks are cut to what fits in the time left before the
  nearest deadline, from a cost model fitted to the measured step times that knows a chunk
  deep in a long prompt costs more per token (attention over its context), less a margin
  as wide as the model's recent misses;
* waiting prompts are admitted shortest first (then by ``priority``, lower first, as vLLM),
  except that any prompt waiting longer than the age cap goes first, oldest first, so a long
  prompt is delayed but never starved; preempted sequences keep their place at the front.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Callable, Iterable, NamedTuple

import numpy as np

from atlas_core.engine.sequence import Sequence

#: Names ``--scheduling-policy`` accepts, with their aliases.
POLICY_NAMES = {"fifo": "fifo", "slo": "slo", "slai": "slo"}
#: Fewest prefill tokens an slo step computes, so long prompts always advance.
MIN_PREFILL_CHUNK = 64
#: Measured step times above this multiple of the predicted one are idle gaps, not costs.
OUTLIER_FACTOR = 10.0
#: The slo budget aims this quantile of recent (measured / predicted) step time under the deadline.
MARGIN_QUANTILE = 0.9


class StepCoefficients(NamedTuple):
    """Seconds: per step, per query token, per attention pair, per token of chunk context."""

    base: float
    per_token: float
    per_pair: float
    per_context: float


def step_features(scheduled: Iterable) -> tuple[int, float, float]:
    """``(num_tokens, pairs, context)`` of a step's chunks, as :class:`StepCostModel` fits."""
    num_tokens, pairs, context = 0, 0.0, 0.0
    for s in scheduled:
        num_tokens += s.num_tokens
        if s.num_tokens > 1 or s.seq.is_prefilling:
            mid = s.start + s.num_tokens / 2
            pairs += s.num_tokens * mid
            context += mid
    return num_tokens, pairs, context


class StepCostModel:
    """Seconds per step, least squares over recent steps::

        base + per_token * num_tokens + per_pair * pairs + per_context * context

    ``num_tokens`` counts every query token (decode rows included). Over the step's prefill
    chunks of ``n`` tokens from position ``start``, ``pairs`` sums ``n * (start + n / 2)``, the
    query-key pairs of causal attention, so a late chunk of a long prompt costs more per token;
    ``context`` sums ``start + n / 2``: an attention kernel does not get faster below some chunk
    width, so a small chunk deep in a prompt costs about its context. A coefficient that fits
    negative is dropped and the rest refitted. A step taking more than :data:`OUTLIER_FACTOR`
    times the prediction is not a step cost (the engine sat idle between two steps) and is
    left out.

    Args:
        window: steps kept for the fit.
        num_misses: prefill steps whose measured / predicted time sizes :meth:`margin`.
    """

    def __init__(self, window: int = 256, num_misses: int = 64) -> None:
        self._data = np.zeros((window, 4))
        self.num_samples = 0
        self._next = 0
        self._misses: deque[float] = deque(maxlen=num_misses)
        self._coef: StepCoefficients | None = None
        self._fitted: StepCoefficients | None = None

    def observe(self, num_tokens: int, seconds: float, pairs: float = 0.0,
                context: float = 0.0) -> None:
        if num_tokens <= 0 or seconds < 0:
            return
        predicted = self.predict(num_tokens, pairs, context, self._fitted)
        if self._fitted is not None and seconds > OUTLIER_FACTOR * predicted:
            return
        if (pairs or context) and predicted > 0:
            self._misses.append(seconds / predicted)
        self._data[self._next] = (num_tokens, pairs, context, seconds)
        self._next = (self._next + 1) % len(self._data)
        self.num_samples = min(self.num_samples + 1, len(self._data))
        self._coef = None

    def coefficients(self) -> StepCoefficients | None:
        """The fitted :class:`StepCoefficients`, or ``None`` before any step was measured."""
        if self._coef is None and self.num_samples:
            data = self._data[:self.num_samples]
            x = np.ones((len(data), 4))
            x[:, 1:] = data[:, :3]
            scale = np.maximum(x.max(axis=0), 1e-30)
            x /= scale
            gram, rhs = x.T @ x, x.T @ data[:, 3]
            # Tikhonov-small ridge: a feature never seen (no prefill yet) fits 0, not NaN.
            gram += np.eye(4) * 1e-12 * np.trace(gram)
            cols = [0, 1, 2, 3]
            while True:
                sol = np.linalg.solve(gram[np.ix_(cols, cols)], rhs[cols])
                if len(cols) == 1 or (sol >= 0).all():
                    break
                cols.pop(int(np.argmin(sol)))
            coef = [0.0] * 4
            for i, v in zip(cols, sol / scale[cols]):
                coef[i] = max(0.0, float(v))
            self._coef = self._fitted = StepCoefficients(*coef)
        return self._coef

    def fit(self) -> tuple[float, float] | None:
        """``(base, per_token)`` seconds, or ``None`` before any step was measured."""
        coef = self.coefficients()
        return None if coef is None else (coef.base, coef.per_token)

    def predict(self, num_tokens: int, pairs: float = 0.0, context: float = 0.0,
                coef: StepCoefficients | None = None) -> float:
        """Seconds of a step (0 before any step was measured); ``coef``: these coefficients
        instead of a fit of every step kept (``observe`` judges a step by the last fit)."""
        coef = coef or self.coefficients()
        if coef is None:
            return 0.0
        return (coef.base + coef.per_token * num_tokens + coef.per_pair * pairs
                + coef.per_context * context)

    def margin(self) -> float:
        """How far recent prefill steps overran their prediction, made before they were
        measured: the :data:`MARGIN_QUANTILE` of measured / predicted, at least 1."""
        if not self._misses:
            return 1.0
        ranked = sorted(self._misses)
        return max(1.0, ranked[min(len(ranked) - 1, int(MARGIN_QUANTILE * len(ranked)))])

    def tokens_within(self, seconds: float, start: int = 0, num_rows: int = 0) -> int | None:
        """Most tokens of one prefill chunk from position ``start`` that, beside ``num_rows``
        decode rows, fit in a step of ``seconds`` (``None``: no per-token estimate yet)."""
        coef = self.coefficients()
        if coef is None:
            return None
        rest = seconds - coef.base - coef.per_token * num_rows - coef.per_context * start
        linear = coef.per_token + coef.per_pair * start + coef.per_context / 2
        if linear <= 0 and coef.per_pair <= 0:
            return None
        if rest <= 0:
            return 0
        # linear * n + per_pair / 2 * n**2 = rest; 1e-6: an exact fit's rounding loses no token
        root = math.sqrt(linear * linear + 2 * coef.per_pair * rest)
        return max(0, int(2 * rest / (linear + root) + 1e-6))


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
        """Prefill tokens this step may compute (``budget``: ``max_prefill_tokens``); asked
        only when a sequence waits or a running one is still prefilling."""
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
        self._last: tuple | None = None

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    def _deadline(self, seq: Sequence, now: float) -> float:
        return self.last_token.get(seq.seq_id, now) + self.tbt_deadline_s

    def order_running(self, order, now):
        self._close_step(now)
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
        self._close_step(now)
        decoding = [s for s in running if not s.is_prefilling]
        if not decoding:
            return budget
        slack = max(min(self._deadline(s, now) for s in decoding) - now, 0.0)
        start = max((s.num_computed_tokens for s in running if s.is_prefilling), default=0)
        fits = self.cost.tokens_within(slack / self.cost.margin(), start, len(decoding))
        if fits is None:
            return budget
        return max(min(MIN_PREFILL_CHUNK, budget), min(budget, fits))

    def on_step(self, scheduled, num_tokens, now):
        self._close_step(now)
        sampled = [s.seq.seq_id for s in scheduled if s.samples]
        if num_tokens:
            self._last = (now, *step_features(scheduled), sampled)
        for s in scheduled:
            self.arrival.pop(s.seq.seq_id, None)
        for seq_id in sampled:
            self.last_token.setdefault(seq_id, now)

    def _close_step(self, now: float) -> None:
        """The step planned last ended by ``now``: measure it and date the tokens it gave."""
        if self._last is None:
            return
        start, num_tokens, pairs, context, sampled = self._last
        self._last = None
        self.cost.observe(num_tokens, now - start, pairs, context)
        for seq_id in sampled:
            if seq_id in self.last_token:
                self.last_token[seq_id] = now

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
