"""Async scheduling: which decode steps may run ahead of the host's view of the last token.

With ``EngineArgs.async_scheduling`` the engine keeps one decode step in flight. While the
device runs step N, the host plans step N+1 (positions + 1, slot mapping with the block
allocated ahead, block tables), uploads it, copies N's sampled ids into N+1's input ids on the
device and launches N+1; only then does it wait for N's ids (the step's one host sync) and run
detokenisation, stop checks and output delivery for N while N+1 runs.

A sequence that N ends (EOS, stop token or string) has one extra token computed by N+1; the
engine drops it unseen and its blocks and state slot are already free (later steps queue behind
N+1 on the device, so reusing them is safe). Sequences that N ends by ``max_tokens`` or the
context limit are known in advance and left out of N+1.

A step runs synchronously (the chain drains first) when it cannot be planned blind:

- prefill or mixed steps, and steps restoring or saving recurrent-state snapshots;
- sequences waiting for admission (they need a prefill), a running set other than the step in
  flight's (batch rotation past ``max_batch_size``, prefill chunks), or a block shortage (the
  scheduler may have to preempt);
- a row (any one makes the whole step synchronous) whose sampling needs the host's view of
  the output so far: guided decoding (the grammar mask), penalties, logit bias, ``min_tokens``
  still masking EOS, logprobs (read back with the step), and thinking budgets (the host may
  replace the sampled token).

A new request therefore joins one decode step later than it would synchronously (its prefill
waits for the step in flight to be read).

n > 1 siblings, seeded sampling (the step counter counts the pending token), abort (the
sequence's tokens in flight are dropped) and hybrid models (the state slot is updated in
place by every decode step) need nothing special.
"""

from __future__ import annotations

from atlas_core.engine.sampler import LogitsRow, Sampler
from atlas_core.engine.scheduler import Scheduler, SchedulerOutput
from atlas_core.engine.sequence import Sequence


class OverlapPolicy:
    """Decides which steps the engine may launch without waiting for the previous one.

    Args:
        scheduler: the engine's scheduler (plans the chained step).
        max_seq_len: the engine's context limit (a sequence reaching it ends).
    """

    def __init__(self, scheduler: Scheduler, max_seq_len: int) -> None:
        self.scheduler = scheduler
        self.max_seq_len = max_seq_len

    def can_launch(self, sched: SchedulerOutput, rows_of: dict[int, list[LogitsRow]]) -> bool:
        """Whether a freshly scheduled step may start a chain (a plain decode-graph step)."""
        if not sched.is_decode_only or sched.restores or sched.snapshots:
            return False
        rows = [r for s in sched.scheduled for r in rows_of.get(s.seq.seq_id, ())]
        return (len(rows) == len(sched.scheduled) and all(r.samples for r in rows)
                and not Sampler.needs_eager(rows))

    def plan_next(self, prev: SchedulerOutput) -> SchedulerOutput | None:
        """The decode step to launch after ``prev`` (on the device, not read), or ``None``."""
        seqs = [s.seq for s in prev.scheduled
                if not s.seq.is_finished and not self._ends_with_pending(s.seq)]
        if not all(self.chainable(seq) for seq in seqs):
            return None
        return self.scheduler.schedule_ahead(prev, seqs)

    def _ends_with_pending(self, seq: Sequence) -> bool:
        # The token in flight is its last: max_tokens or the context limit.
        p = seq.params
        return ((p.max_tokens is not None and len(seq.output_token_ids) + 1 >= p.max_tokens)
                or len(seq) + 1 >= self.max_seq_len)

    @staticmethod
    def chainable(seq: Sequence) -> bool:
        """Whether ``seq``'s next row samples the same without the pending token on the host."""
        p = seq.params
        return (p.thinking_budget is None and p.guided is None and not p.has_penalties
                and not p.logit_bias and p.logprobs is None
                and len(seq.output_token_ids) + 1 >= p.min_tokens)
