"""When speculation pays: drafts per sequence from the measured acceptance, batch and context.

With a per-draft acceptance rate ``a`` (measured, per context range), ``k`` drafts yield
``1 + a + a^2 + ... + a^k`` tokens per verified sequence, for a step that costs about
``1 + draft_token_cost * k * batch`` plain decode steps (a verify step reads the weights once,
but its extra query rows add work that grows with the batch). The gate picks the ``k`` with
the most tokens per unit of cost; ``0`` turns speculation off for that context range, and one
step in :data:`PROBE_EVERY` still drafts one token there so a changed workload is noticed.
"""

from __future__ import annotations

#: Context-length ranges with their own acceptance estimate (users report acceptance falling
#: at long context).
CONTEXT_BOUNDS = (4096, 16384, 32768)
#: Weight of the past in the acceptance estimate, per verified sequence step.
DECAY = 0.98
#: Acceptance assumed before anything is measured.
PRIOR_RATE, PRIOR_WEIGHT = 0.6, 4.0
#: A range the gate turned off still drafts one token every this many decisions.
PROBE_EVERY = 32


class SpecGate:
    """Measured acceptance per context range and the number of drafts it justifies.

    Args:
        max_drafts: the configured ``num_speculative_tokens``.
        draft_token_cost: relative cost of one verified draft position.
        max_batch: no drafts in steps with more decoding sequences than this.
        max_context_len: no drafts past this length (``None``: no cap).
    """

    def __init__(self, max_drafts: int, draft_token_cost: float, max_batch: int,
                 max_context_len: int | None = None) -> None:
        self.max_drafts, self.cost = max_drafts, draft_token_cost
        self.max_batch, self.max_context_len = max_batch, max_context_len
        num = len(CONTEXT_BOUNDS) + 1
        self.accepted = [PRIOR_RATE * PRIOR_WEIGHT] * num
        self.trials = [PRIOR_WEIGHT] * num
        self._decisions = [0] * num

    @staticmethod
    def bucket(context_len: int) -> int:
        """Index of the context range ``context_len`` falls in."""
        return sum(context_len >= b for b in CONTEXT_BOUNDS)

    def rate(self, context_len: int) -> float:
        """Estimated probability that one more draft is accepted at this context length."""
        i = self.bucket(context_len)
        return self.accepted[i] / self.trials[i]

    def num_drafts(self, context_len: int, batch: int) -> int:
        """Drafts worth verifying for one sequence of ``context_len`` tokens in a step of
        ``batch`` decoding sequences (0: decode it plainly)."""
        if batch > self.max_batch or (self.max_context_len is not None
                                      and context_len > self.max_context_len):
            return 0
        best = best_k(self.rate(context_len), self.max_drafts, self.cost * batch)
        i = self.bucket(context_len)
        self._decisions[i] += 1
        if best == 0 and self._decisions[i] % PROBE_EVERY == 0:
            return 1
        return best

    def record(self, context_len: int, num_drafted: int, num_accepted: int) -> None:
        """Count one verified sequence step: ``num_accepted`` of ``num_drafted`` drafts held."""
        if num_drafted <= 0:
            return
        i = self.bucket(context_len)
        trials = num_accepted + (num_accepted < num_drafted)
        self.accepted[i] = self.accepted[i] * DECAY + num_accepted
        self.trials[i] = self.trials[i] * DECAY + trials


def best_k(rate: float, max_drafts: int, cost_per_draft: float) -> int:
    """The ``k <= max_drafts`` maximising ``(1 + rate + ... + rate^k) / (1 + k * cost)``."""
    best, best_value, gain, term = 0, 1.0, 1.0, 1.0
    for k in range(1, max_drafts + 1):
        term *= rate
        gain += term
        value = gain / (1.0 + k * cost_per_draft)
        if value > best_value + 1e-9:
            best, best_value = k, value
    return best
