"""Scheduling policies: the order of decode rows and admissions, and each step's prefill budget.

``fifo`` keeps the scheduler's own order: running sequences round-robin, the waiting queue
first come first served, every step's prefill budget ``max_prefill_tokens``. ``slo`` (alias
``slai``, the name users of the original engine know) serves a time-between-tokens target:

* decode rows closest to their deadline (the end of the step that gave their last token +
  ``tbt_deadline``) go first;
* a step with any prefill chunk is *eager*: on a backend with decode graphs it is no graph
  replay, and on the H200 (qwen3-8b) it costs ~27 ms more than the ~5 ms decode step, however
  small its chunk (``atlas_core.testing.sched_sim``), so it makes one slow gap in every stream.
  Chunks cut to fit the deadline then buy nothing: each chunk step is slow anyway, and a 32k
  prompt crawled at 2.5x fifo's TTFT on the GPU. Once the fitted eager cost exceeds a decode
  step (:meth:`SloPolicy.eager_interrupts`), eager steps are rationed instead: each
  decode-only step of ``n`` rows earns ``n *`` :data:`INTERRUPT_SHARE` credit, an eager step
  spends one per decoding row, and waiting prompts are held until the credit covers the
  rows, a prompt waited the age cap, a preempted stream waits, or the waiting prompts fill a
  step's budget. Held prompts are then admitted together (one eager step for several), and a
  started prompt continues in chunks back to back, each sized by a cost model fitted to the
  measured step times (the eager cost, attention over a chunk's context) to end within
  :data:`STALL_DEADLINES` deadlines. So few of the streams' gaps are slow, which is what
  their p99 counts; the price is the TTFT of a short prompt sent while streams decode (the
  simulation: median 0.48 s against fifo's 0.04 s, p99 unchanged);
* without decode graphs (every step eager alike), while sequences decode, each step's
  prefill is cut to what fits before the nearest deadline, less a margin as wide as the cost
  model's recent misses;
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
#: The slo budget aims this quantile of recent (measured / predicted) step time under its target.
MARGIN_QUANTILE = 0.9
#: Widest margin: a model that underestimates more than this is refitted, not padded around.
MAX_MARGIN = 2.0
#: Share of the streams' gaps that eager steps admitting short prompts may interrupt: a fifth
#: of what a p99 target leaves, as a long prompt's chunks interrupt them too (more than this
#: and the p99 lands on an eager step, as under fifo).
INTERRUPT_SHARE = 0.002
#: Most eager-step credit kept, in decode rows, so a quiet spell does not buy a burst of them.
MAX_CREDIT_ROWS = 64.0
#: An eager step's prefill is sized to end within this many deadlines. Each chunk step of a
#: long prompt is a slow gap of every stream, so fewer, fuller ones serve their p99 better
#: (and pay the eager cost less often): at 50 ms a 32k prompt takes about fifo's full chunks;
#: deeper into longer prompts, where a full chunk would stall the streams 2 s and more, the
#: cap binds.
STALL_DEADLINES = 30.0
#: Eager steps measured before :meth:`SloPolicy.eager_interrupts` trusts the fitted eager cost.
MIN_EAGER_SAMPLES = 8


class StepCoefficients(NamedTuple):
    """Seconds: per step, per query token, per attention pair, per token of chunk context,
    and per eager step (any prefill chunk: not a decode graph replay)."""

    base: float
    per_token: float
    per_pair: float
    per_context: float
    eager: float = 0.0


def step_features(scheduled: Iterable) -> tuple[int, float, float, float]:
    """``(num_tokens, pairs, context, eager)`` of a step's chunks, as :class:`StepCostModel`
    fits; ``eager`` is 1 when any chunk is a prefill chunk."""
    num_tokens, pairs, context, eager = 0, 0.0, 0.0, 0.0
    for s in scheduled:
        num_tokens += s.num_tokens
        if s.num_tokens > 1 or s.seq.is_prefilling:
            mid = s.start + s.num_tokens / 2
            pairs += s.num_tokens * mid
            context += mid
            eager = 1.0
    return num_tokens, pairs, context, eager


class StepCostModel:
    """Seconds per step, least squares over recent steps::

        base + per_token * num_tokens + per_pair * pairs + per_context * context + eager

    ``num_tokens`` counts every query token (decode rows included). Over the step's prefill
    chunks of ``n`` tokens from position ``start``, ``pairs`` sums ``n * (start + n / 2)``, the
    query-key pairs of causal attention, so a late chunk of a long prompt costs more per token;
    ``context`` sums ``start + n / 2``: an attention kernel does not get faster below some chunk
    width, so a small chunk deep in a prompt costs about its context. ``eager`` is paid by any
    step with a prefill chunk: decode-only steps replay a graph, the others launch every
    kernel from the host (on the H200 ~27 ms for qwen3-8b, 5x a decode step). A coefficient
    that fits negative is dropped and the rest refitted. A step taking more than
    :data:`OUTLIER_FACTOR` times the prediction is not a step cost (the engine sat idle
    between two steps) and is left out.

    Args:
        window: steps kept for the fit.
        num_misses: prefill steps whose measured / predicted time sizes :meth:`margin`.
    """

    def __init__(self, window: int = 256, num_misses: int = 16) -> None:
        self._data = np.zeros((window, 5))
        self.num_samples = 0
        #: Eager steps observed (ever, not only in the window).
        self.num_eager = 0
        self._next = 0
        self._misses: deque[float] = deque(maxlen=num_misses)
        self._coef: StepCoefficients | None = None
        self._fitted: StepCoefficients | None = None

    def observe(self, num_tokens: int, seconds: float, pairs: float = 0.0,
                context: float = 0.0, eager: float = 0.0) -> None:
        if num_tokens <= 0 or seconds < 0:
            return
        predicted = self.predict(num_tokens, pairs, context, self._fitted, eager)
        if self._fitted is not None and seconds > OUTLIER_FACTOR * predicted:
            return
        if (pairs or context or eager) and predicted > 0:
            self._misses.append(seconds / predicted)
        self.num_eager += eager > 0
        self._data[self._next] = (num_tokens, pairs, context, eager, seconds)
        self._next = (self._next + 1) % len(self._data)
        self.num_samples = min(self.num_samples + 1, len(self._data))
        self._coef = None

    def coefficients(self) -> StepCoefficients | None:
        """The fitted :class:`StepCoefficients`, or ``None`` before any step was measured."""
        if self._coef is None and self.num_samples:
            data = self._data[:self.num_samples]
            x = np.ones((len(data), 5))
            x[:, 1:] = data[:, :4]
            scale = np.maximum(x.max(axis=0), 1e-30)
            x /= scale
            gram, rhs = x.T @ x, x.T @ data[:, 4]
            # Tikhonov-small ridge: a feature never seen (no prefill yet) fits 0, not NaN.
            gram += np.eye(5) * 1e-12 * np.trace(gram)
            cols = [0, 1, 2, 3, 4]
            while True:
                sol = np.linalg.solve(gram[np.ix_(cols, cols)], rhs[cols])
                if len(cols) == 1 or (sol >= 0).all():
                    break
                cols.pop(int(np.argmin(sol)))
            coef = [0.0] * 5
            for i, v in zip(cols, sol / scale[cols]):
                coef[i] = max(0.0, float(v))
            self._coef = self._fitted = StepCoefficients(*coef)
        return self._coef

    def fit(self) -> tuple[float, float] | None:
        """``(base, per_token)`` seconds, or ``None`` before any step was measured."""
        coef = self.coefficients()
        return None if coef is None else (coef.base, coef.per_token)

    def predict(self, num_tokens: int, pairs: float = 0.0, context: float = 0.0,
                coef: StepCoefficients | None = None, eager: float = 0.0) -> float:
        """Seconds of a step (0 before any step was measured); ``coef``: these coefficients
        instead of a fit of every step kept (``observe`` judges a step by the last fit)."""
        coef = coef or self.coefficients()
        if coef is None:
            return 0.0
        return (coef.base + coef.per_token * num_tokens + coef.per_pair * pairs
                + coef.per_context * context + coef.eager * eager)

    def margin(self) -> float:
        """How far recent prefill steps overran their prediction, made before they were
        measured: the :data:`MARGIN_QUANTILE` of measured / predicted, between 1 and
        :data:`MAX_MARGIN` (a margin fed by its own shrinking chunks must not spiral)."""
        if not self._misses:
            return 1.0
        ranked = sorted(self._misses)
        quantile = ranked[min(len(ranked) - 1, int(MARGIN_QUANTILE * len(ranked)))]
        return min(MAX_MARGIN, max(1.0, quantile))

    def tokens_within(self, seconds: float, start: int = 0, num_rows: int = 0) -> int | None:
        """Most tokens of one prefill chunk from position ``start`` that, beside ``num_rows``
        decode rows, fit in a step of ``seconds`` (``None``: no per-token estimate yet)."""
        coef = self.coefficients()
        if coef is None:
            return None
        rest = (seconds - coef.base - coef.eager - coef.per_token * num_rows
                - coef.per_context * start)
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

    def prefill_budget(self, budget: int, running: list[Sequence], now: float,
                       waiting: Iterable[Sequence] = ()) -> int:
        """Prefill tokens this step may compute (``budget``: ``max_prefill_tokens``; 0: a
        decode-only step); asked only when a sequence waits or a running one is prefilling."""
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
        #: Eager steps the streams can take now, in decoding rows (see the module docstring).
        self.credit = 0.0
        self._interrupts = False
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

    def prefill_budget(self, budget, running, now, waiting=()):
        self._close_step(now)
        decoding = [s for s in running if not s.is_prefilling]
        if not decoding:
            return budget
        rows = len(decoding)
        prefilling = [s for s in running if s.is_prefilling]
        if self.eager_interrupts(rows):
            if (not prefilling and self.credit < rows
                    and not self._must_admit(waiting, budget, now)):
                return 0
            seconds = STALL_DEADLINES * self.tbt_deadline_s
        else:
            seconds = max(min(self._deadline(s, now) for s in decoding) - now, 0.0)
        start = max((s.num_computed_tokens for s in prefilling), default=0)
        fits = self.cost.tokens_within(seconds / self.cost.margin(), start, rows)
        if fits is None:
            return budget
        return max(min(MIN_PREFILL_CHUNK, budget), min(budget, fits))

    def eager_interrupts(self, rows: int) -> bool:
        """Whether a step with a prefill chunk costs more than a decode step of ``rows`` rows
        over it (decode graphs): then even the smallest chunk makes a slow gap, chunks fitted
        to the deadline would crawl, and eager steps are rationed instead. Without graphs
        (or before :data:`MIN_EAGER_SAMPLES` eager steps were measured) chunks are fitted to
        the nearest deadline. Once seen it stays: a backend does not lose its graphs, and a
        fit over a window of mostly long-prompt chunks can hide the eager cost in attention."""
        if not self._interrupts and self.cost.num_eager >= MIN_EAGER_SAMPLES:
            coef = self.cost.coefficients()
            self._interrupts = coef.eager > coef.base + coef.per_token * rows
        return self._interrupts

    def _must_admit(self, waiting: Iterable[Sequence], budget: int, now: float) -> bool:
        """The next step is eager whatever the credit: a preempted stream waits to resume, a
        prompt waited the age cap, or the waiting prompts fill a step's whole ``budget`` (the
        eager cost is then a small part of the step, and holding them longer would not save
        an eager step)."""
        tokens = 0
        for seq in waiting:
            arrived = self.arrival.setdefault(seq.seq_id, now)
            tokens += len(seq) - seq.num_computed_tokens
            if seq.output_token_ids or now - arrived >= self.age_cap_s or tokens >= budget:
                return True
        return False

    def on_step(self, scheduled, num_tokens, now):
        self._close_step(now)
        sampled = [s.seq.seq_id for s in scheduled if s.samples]
        features = step_features(scheduled)
        rows = sum(1 for s in scheduled if s.num_tokens == 1 and not s.seq.is_prefilling)
        if features[3]:
            # Debt is not carried: the steps that run without credit are bounded already (the
            # age cap, preemptions, a started prompt), and debt would hold back the next ones.
            self.credit = max(0.0, self.credit - rows)
        else:
            self.credit = min(MAX_CREDIT_ROWS, self.credit + INTERRUPT_SHARE * rows)
        if num_tokens:
            self._last = (now, *features, sampled)
        for s in scheduled:
            self.arrival.pop(s.seq.seq_id, None)
        for seq_id in sampled:
            self.last_token.setdefault(seq_id, now)

    def _close_step(self, now: float) -> None:
        """The step planned last ended by ``now``: measure it and date the tokens it gave."""
        if self._last is None:
            return
        start, num_tokens, pairs, context, eager, sampled = self._last
        self._last = None
        self.cost.observe(num_tokens, now - start, pairs, context, eager)
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
