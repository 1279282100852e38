"""Scheduler: continuous batching of prefill chunks and decode rows over a paged KV cache."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from atlas_core.engine.block_manager import BlockManager
from atlas_core.engine.scheduling_policy import SchedulingPolicy
from atlas_core.engine.sequence import Sequence, SequenceStatus
from atlas_core.engine.state_cache import StateCache


@dataclass
class ScheduledSeq:
    """One sequence's share of a step: ``num_tokens`` query tokens from ``start``; the last
    ``len(draft_token_ids)`` of them are speculative drafts (:mod:`atlas_core.engine.spec`)."""

    seq: Sequence
    start: int
    num_tokens: int
    draft_token_ids: list[int] = field(default_factory=list)

    @property
    def samples(self) -> bool:
        """This chunk reaches the end of the stream, so a token is sampled from its last row."""
        return self.start + self.num_tokens - len(self.draft_token_ids) == len(self.seq)


@dataclass
class SchedulerOutput:
    """One step's plan. ``restores`` / ``snapshots``: recurrent-state row copies ``(src, dst)``
    to issue before / after the forward (hybrid models). ``spec_state_rows``: for sequences
    with drafts on hybrid models, the state row each query position writes (seq_id -> rows)."""

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    restores: list[tuple[int, int]] = field(default_factory=list)
    snapshots: list[tuple[int, int]] = field(default_factory=list)
    spec_state_rows: dict[int, list[int]] | None = None

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def is_decode_only(self) -> bool:
        return bool(self.scheduled) and all(s.num_tokens == 1 for s in self.scheduled)


class Scheduler:
    """Decides which sequences run in the next step and how many tokens each computes.

    Every step first serves the running sequences (decode rows and unfinished prefill chunks),
    oldest first, then admits waiting ones while sequence slots, batch rows, the prefill token
    budget and KV blocks allow. When a running sequence needs a block and none is free, the
    newest running sequence is preempted: its blocks are freed and it goes back to the front of
    the queue keeping its generated tokens, to be recomputed later (its full blocks usually
    survive in the prefix cache). A waiting sequence whose cached prefix is being read back from
    disk (``block_manager.tiers``) is passed over until its blocks are in memory; when nothing
    else can run, :meth:`schedule` waits briefly for those reads.

    On hybrid models (``state_cache`` given) a running sequence also owns a recurrent-state slot.
    With snapshots enabled, prefill chunks are cut at block boundaries (the last boundary before a
    stream's final token included) and the state is snapshotted there, so a later sequence with
    the same prefix restores it instead of recomputing.

    Args:
        block_manager: the KV block pool.
        max_num_seqs: most running sequences.
        max_batch_size: most sequences in one step.
        max_prefill_tokens: most prefill tokens in one step (decode rows are not counted).
        state_cache: recurrent-state slots and snapshots (hybrid models), else ``None``.
        policy: the order of decode rows and admissions and each step's prefill budget
            (:mod:`atlas_core.engine.scheduling_policy`; default ``fifo``).
    """

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_batch_size: int,
                 max_prefill_tokens: int, state_cache: StateCache | None = None,
                 policy: SchedulingPolicy | None = None) -> None:
        self.block_manager = block_manager
        self.policy = policy or SchedulingPolicy()
        self.state_cache = state_cache
        self.snapshots_enabled = bool(state_cache is not None and state_cache.num_snapshots
                                      and block_manager.enable_prefix_caching)
        self.max_num_seqs = max_num_seqs
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._rr = 0

    def add(self, seq: Sequence, front: bool = False) -> None:
        seq.status = SequenceStatus.WAITING
        if front:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove ``seq`` (finished or aborted) and free its blocks at once."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._free(seq)
        self.policy.forget(seq)
        seq.status = SequenceStatus.FINISHED

    def _free(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        if self.state_cache is not None:
            self.state_cache.release(seq)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        now = self.policy.clock()
        budget = self.max_prefill_tokens
        if self.waiting or any(seq.is_prefilling for seq in self.running):
            budget = self.policy.prefill_budget(budget, self.running, now, self.waiting)
        budget = self._schedule_running(out, budget, now)
        if not out.preempted:
            ordered = self.policy.order_waiting(self.waiting, now) if self.waiting else None
            if ordered is not None:
                self.waiting.clear()
                self.waiting.extend(ordered)
            self._admit_waiting(out, budget)
            tiers = self.block_manager.tiers
            if not out.scheduled and self.waiting and tiers is not None and tiers.wait_reads():
                self._admit_waiting(out, budget)
        self.policy.on_step(out.scheduled, out.num_tokens, now)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int, now: float) -> int:
        chosen: set[int] = set()
        order = self.policy.order_running(self.running[self._rr:] + self.running[:self._rr], now)
        if len(self.running) > self.max_batch_size:
            self._rr = (self._rr + self.max_batch_size) % len(self.running)
        bs, scheduled = self.block_manager.block_size, out.scheduled
        for seq in order:
            if len(scheduled) >= self.max_batch_size:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            start = seq.num_computed_tokens
            prefilling = seq.is_prefilling
            num_tokens = self._chunk_size(seq, start, budget) if prefilling else 1
            if num_tokens == 0:
                continue
            if start + num_tokens > len(seq.block_table) * bs:
                if not self._make_room(seq, start + num_tokens, chosen, out):
                    continue
                self.block_manager.allocate(seq, start + num_tokens)
            scheduled.append(ScheduledSeq(seq, start, num_tokens))
            chosen.add(seq.seq_id)
            if prefilling:
                budget -= num_tokens
                self._plan_snapshot(out, seq, start + num_tokens)
        return budget

    def _chunk_size(self, seq: Sequence, start: int, budget: int) -> int:
        """Prefill tokens for ``seq`` this step; cut at a block boundary when snapshots are on."""
        n = min(len(seq) - start, budget)
        if not self.snapshots_enabled or n <= 0:
            return n
        bs, end = self.block_manager.block_size, start + n
        last = (len(seq) - 1) // bs * bs
        if start < last < end:
            return last - start
        if end < len(seq) and end // bs * bs > start:
            return end // bs * bs - start
        return n

    def _plan_snapshot(self, out: SchedulerOutput, seq: Sequence, end: int) -> None:
        bs = self.block_manager.block_size
        if not self.snapshots_enabled or end % bs:
            return
        self.block_manager.update_hashes(seq, end)
        copy = self.state_cache.save(seq, seq.block_hashes[end // bs - 1])
        if copy is not None:
            out.snapshots.append(copy)

    def _make_room(self, seq: Sequence, num_tokens: int, chosen: set[int],
                   out: SchedulerOutput) -> bool:
        while not self.block_manager.can_allocate(seq, num_tokens):
            victims = [s for s in reversed(self.running) if s.seq_id not in chosen and s is not seq]
            victim = victims[0] if victims else seq
            self.preempt(victim)
            out.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def preempt(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks and requeue it at the front; it keeps its generated tokens."""
        self.running.remove(seq)
        self._free(seq)
        seq.num_computed_tokens = 0
        self.num_preemptions += 1
        self.add(seq, front=True)

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        bm, states = self.block_manager, self.state_cache
        usable = states.usable_blocks if states is not None else None
        loading: list[Sequence] = []
        while (self.waiting and budget > 0 and len(self.running) < self.max_num_seqs
               and len(out.scheduled) < self.max_batch_size):
            seq = self.waiting[0]
            available = bm.prefetch(seq)
            if available is None or (states is not None and not states.prefetch(seq, available)):
                loading.append(self.waiting.popleft())
                continue
            cached = bm.match_prefix(seq, usable)
            num_tokens = self._chunk_size(seq, cached, budget)
            if not bm.can_allocate(seq, cached + num_tokens):
                bm.free(seq)
                break
            self.waiting.popleft()
            if states is not None:
                states.assign(seq)
                copy = states.restore(seq, cached // bm.block_size) if cached else None
                if copy is not None:
                    out.restores.append(copy)
            seq.num_computed_tokens = cached
            bm.record_lookup(len(seq), cached)
            if not seq.output_token_ids:
                seq.num_cached_tokens = cached
            bm.allocate(seq, cached + num_tokens)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, cached, num_tokens))
            budget -= num_tokens
            if len(seq) - cached > 1:
                self._plan_snapshot(out, seq, cached + num_tokens)
        self.waiting.extendleft(reversed(loading))

    def schedule_ahead(self, prev: SchedulerOutput, seqs: list[Sequence]) -> SchedulerOutput | None:
        """Plan the decode step after ``prev`` (still on the device) for ``seqs`` (async scheduling).

        Each sequence computes the token ``prev`` samples for it, one position past ``prev``'s,
        with its block allocated now. Returns ``None``, changing nothing, when the plan would
        differ from what :meth:`schedule` decides once ``prev`` is complete: sequences wait to be
        admitted (unless the policy holds them back: a prefill budget of 0), the running set is
        not ``prev``'s, the batch rotates, or a block is short (preemption).
        """
        if len(self.running) > self.max_batch_size or not seqs:
            return None
        live = {s.seq.seq_id: s.start for s in prev.scheduled if not s.seq.is_finished}
        if set(live) != {seq.seq_id for seq in self.running} or any(
                s.num_tokens != 1 for s in prev.scheduled):
            return None
        if (self.waiting and len(self.running) < self.max_num_seqs and self.policy.prefill_budget(
                self.max_prefill_tokens, self.running, self.policy.clock(), self.waiting) > 0):
            return None
        bm = self.block_manager
        if sum(bm.blocks_needed(seq, live[seq.seq_id] + 2) for seq in seqs) > bm.num_free_blocks:
            return None
        out = SchedulerOutput()
        for seq in seqs:
            start = live[seq.seq_id] + 1
            bm.allocate(seq, start + 1)
            out.scheduled.append(ScheduledSeq(seq, start, 1))
        self.policy.on_step(out.scheduled, out.num_tokens, self.policy.clock())
        return out

    def complete_step(self, out: SchedulerOutput) -> None:
        """Advance every scheduled sequence past its computed tokens and cache its full blocks.

        Sequences that finished meanwhile (async scheduling: an abort, or a stop found in the
        previous step's token) are skipped; their blocks are already freed.
        """
        for s in out.scheduled:
            if s.seq.is_finished:
                continue
            s.seq.num_computed_tokens = s.start + s.num_tokens
            self.block_manager.commit(s.seq)
        if self.state_cache is not None:
            self.state_cache.complete_step()
