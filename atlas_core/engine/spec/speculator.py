"""Speculator: drafts before a decode step, acceptance after it, for the engine.

A sequence decoding one token normally computes its last token and samples the next. With
drafts ``d1..dk`` it computes ``[last, d1, ..., dk]`` in the same step (``k + 1`` query rows,
batched with the other sequences, prefill chunks included) and samples a token from every
row. Row ``j``'s token is kept while every earlier draft equalled the token sampled before
it; the first mismatch (or the row after the last draft) contributes the one extra token.

Drafts are deterministic (n-gram lookup, the argmax of an MTP head), so this *is* rejection
sampling: a one-hot draft ``d`` is accepted with probability ``p(d)`` and a rejection samples
from ``p`` without ``d``, renormalised; both are exactly what sampling from ``p`` and comparing
does. Each row samples with the stream position it would have without speculation
(``LogitsRow.draft_index``), so greedy and seeded outputs are the same tokens as without it.

Rejected positions leave KV in slots past ``num_computed_tokens``, overwritten by the next
step; blocks taken for drafts stay with the sequence, which fills them next. Hybrid models
write each position's recurrent state to its own row (``SchedulerOutput.spec_state_rows``)
and the row of the last kept position is copied into the sequence's slot afterwards.

Penalties and DRY see the drafts before each row as output tokens (XTC draws by the same stream
position); guided decoding masks each row with the grammar's state after the drafts before it;
thinking budgets get no drafts past the token the engine would force. ``min_tokens`` still
masking EOS, and ``SamplingParams.speculative=False``, mean no drafts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from atlas_core.engine.sampler import LogitsRow
from atlas_core.engine.scheduler import ScheduledSeq, SchedulerOutput
from atlas_core.engine.spec.config import SpeculativeConfig
from atlas_core.engine.spec.gate import SpecGate
from atlas_core.engine.spec.ngram import NgramProposer


@dataclass
class SpecStats:
    """Counters of verified drafts (``/metrics``)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


class Speculator:
    """Plans drafts into a scheduled step and settles the sequences after it.

    Args:
        config: the speculative settings.
        block_manager: the engine's KV blocks (drafted positions need slots).
        max_seq_len: the engine's context limit.
        proposer: ``propose(seq, k) -> drafts`` and ``observe(layout)`` after every step
            (default: n-gram lookup; :class:`~atlas_core.engine.spec.mtp.MTPProposer`).
        state_rows: first recurrent-state row kept for per-position candidates (hybrid
            models; ``None``: no recurrent layers).
        copy_state_rows: the runner's ``[(src, dst)]`` state-row copy (hybrid models).
        is_blocked: ``seq -> bool``, the engine masks tokens of ``seq`` this step
            (``min_tokens``).
        num_unforced: ``seq ->`` tokens it will take as sampled before the engine forces
            others (thinking budgets; ``None``: no limit).
    """

    def __init__(self, config: SpeculativeConfig, block_manager, max_seq_len: int, *,
                 proposer=None, state_rows: int | None = None,
                 copy_state_rows: Callable | None = None,
                 is_blocked: Callable | None = None,
                 num_unforced: Callable | None = None) -> None:
        self.config = config
        self.block_manager, self.max_seq_len = block_manager, max_seq_len
        self.proposer = proposer or NgramProposer(config.prompt_lookup_min,
                                                  config.prompt_lookup_max)
        self.state_rows, self.copy_state_rows = state_rows, copy_state_rows
        self.is_blocked = is_blocked or (lambda seq: False)
        self.num_unforced = num_unforced or (lambda seq: None)
        self.gate = SpecGate(config.num_speculative_tokens, config.draft_token_cost,
                             config.disable_by_batch_size, config.max_context_len)
        self.stats = SpecStats()
        self._verified: list[tuple] = []
        self._layout: list[tuple] = []

    def snapshot(self) -> SpecStats:
        """A copy of the counters now."""
        return SpecStats(**vars(self.stats))

    @staticmethod
    def eligible(seq) -> bool:
        """Whether ``seq``'s request allows drafts (``SamplingParams.speculative``)."""
        return seq.params.speculative

    def plan(self, sched: SchedulerOutput) -> None:
        """Give decoding sequences of ``sched`` their drafts (``ScheduledSeq.draft_token_ids``)."""
        hybrid = self.state_rows is not None
        decoding = [s for s in sched.scheduled if s.num_tokens == 1 and s.samples]
        if not decoding or (hybrid and (len(decoding) < len(sched.scheduled) or sched.snapshots)):
            return
        batch, k_max, rows = len(decoding), self.config.num_speculative_tokens, {}
        for s in decoding:
            seq = s.seq
            if hybrid and len(rows) >= self.config.disable_by_batch_size:
                break
            if not self.eligible(seq) or self.is_blocked(seq):
                continue
            k = min(self.gate.num_drafts(len(seq), batch), self._room(seq))
            drafts = self.proposer.propose(seq, k) if k > 0 else []
            drafts = drafts[:self._blocks_allow(s, len(drafts))]
            if not drafts:
                continue
            self.block_manager.allocate(seq, s.start + 1 + len(drafts))
            s.draft_token_ids, s.num_tokens = list(drafts), 1 + len(drafts)
            if hybrid:
                base = self.state_rows + len(rows) * k_max
                rows[seq.seq_id] = [base + j for j in range(len(drafts))] + [seq.state_slot]
        if rows:
            sched.spec_state_rows = rows

    def _room(self, seq) -> int:
        # Drafts past max_tokens, the context limit or a forced thinking end are never kept.
        p, left = seq.params, self.max_seq_len - len(seq) - 1
        if p.max_tokens is not None:
            left = min(left, p.max_tokens - len(seq.output_token_ids) - 1)
        unforced = self.num_unforced(seq)
        if unforced is not None:
            left = min(left, unforced - 1)
        return max(0, left)

    def _blocks_allow(self, s: ScheduledSeq, num_drafts: int) -> int:
        bm = self.block_manager
        if bm.can_allocate(s.seq, s.start + 1 + num_drafts):
            return num_drafts
        return max(0, len(s.seq.block_table) * bm.block_size - s.start - 1)

    def rows(self, s: ScheduledSeq, first: LogitsRow) -> list[LogitsRow]:
        """The extra logits rows of ``s``'s drafts after its usual row ``first`` (whose
        guided-decoding matcher they share)."""
        drafts = tuple(s.draft_token_ids)
        return [LogitsRow(s.seq, draft_ids=drafts[:j], matcher=first.matcher)
                for j in range(1, len(drafts) + 1)]

    def select(self, sched: SchedulerOutput, results: list) -> list:
        """Keep each drafted sequence's rows up to its first rejected draft; the step then
        counts as a one-token step for the scheduler (:meth:`settle` fixes the count)."""
        self._layout = [(s.seq, s.start, s.num_tokens) for s in sched.scheduled]
        drafted = {s.seq.seq_id: s for s in sched.scheduled if s.draft_token_ids}
        if not drafted:
            return results
        sampled: dict[int, list[int]] = {seq_id: [] for seq_id in drafted}
        for res in results:
            if res.row.samples and res.row.seq.seq_id in drafted:
                sampled[res.row.seq.seq_id].append(res.token_id)
        accepted = {seq_id: num_accepted(sampled[seq_id], s.draft_token_ids)
                    for seq_id, s in drafted.items()}
        kept = [res for res in results if not res.row.samples
                or res.row.draft_index <= accepted.get(res.row.seq.seq_id, 0)]
        state_rows = sched.spec_state_rows or {}
        for s in drafted.values():
            n = accepted[s.seq.seq_id]
            self._verified.append((s.seq, s.start, len(s.draft_token_ids),
                                   state_rows.get(s.seq.seq_id)))
            self.gate.record(len(s.seq), len(s.draft_token_ids), n)
            self.stats.num_drafts += 1
            self.stats.num_draft_tokens += len(s.draft_token_ids)
            self.stats.num_accepted_tokens += n
            s.draft_token_ids, s.num_tokens = [], 1
        return kept

    def settle(self) -> None:
        """After the step's tokens are appended: every kept draft has its KV (and recurrent
        state) computed; only the last appended token is left for the next step."""
        verified, self._verified = self._verified, []
        copies = []
        for seq, start, num_drafts, rows in verified:
            if seq.is_finished:
                continue
            seq.num_computed_tokens = len(seq) - 1
            self.block_manager.commit(seq)
            kept = seq.num_computed_tokens - start - 1
            if rows is not None and kept < num_drafts:
                copies.append((rows[kept], seq.state_slot))
        if copies:
            self.copy_state_rows(copies)
        layout, self._layout = self._layout, []
        self.proposer.observe(layout)


def num_accepted(sampled: list[int], drafts: list[int]) -> int:
    """Drafts kept: the longest prefix of ``drafts`` equal to the tokens sampled before each
    (``sampled[j]`` comes from the row after draft ``j``; ``sampled[0]`` from the last token).

    With one-hot drafts this is exact rejection sampling: draft ``d`` survives with probability
    ``p(d)``, and on rejection ``sampled[j]`` is a draw from ``p`` given ``!= d``.
    """
    n = 0
    while n < len(drafts) and n < len(sampled) and sampled[n] == drafts[n]:
        n += 1
    return n
