"""Speculative decoding across worker ranks: drafts are planned and verified by the front's
:class:`~atlas_core.engine.spec.Speculator` as on one GPU; what the workers add is below.

* Verify steps need nothing new: a step's description carries each sequence's drafts
  (``ScheduledSeq.draft_token_ids``), its logits rows (``LogitsRow.draft_ids``) and the
  recurrent-state rows of every drafted position (``SchedulerOutput.spec_state_rows``), so
  every rank runs the same ``K + 1``-row step of the single-GPU runner over its heads.
* Rolling a hybrid model's recurrent state back after a rejection is a row copy in every
  rank's own state pools (each holds its heads' state in the same rows): the front sends the
  copies (``("copy", id, [(src, dst)])``, no answer) and every worker applies them before
  its next message.
* The MTP head contains collectives (its attention's ``o_proj``, its MLP's ``down_proj``, the
  vocabulary-parallel embedding and lm_head), so it must run on every rank after every step,
  in the same order. The front cannot run it (it holds no weights) and the workers cannot
  decide alone what to run it on (which tokens were accepted, which sequences finished on a
  stop string, and the KV blocks of chained drafts are the front's). So after each step the
  front describes the head's work (:class:`ObservedSeq` per sequence of the step, with any
  block its chained drafts need already allocated) and sends ``("observe", id, seqs)``;
  every rank runs the single-GPU :class:`~atlas_core.engine.spec.mtp.MTPProposer` on it
  (drafts are the argmax of the all-gathered logits, identical on every rank) and rank 0
  answers with the drafts. One round trip per step, only when some sequence reached new
  positions; n-gram drafting needs none (it reads the front's tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atlas_core.engine.spec.mtp import MTPProposer
from atlas_core.engine.spec.setup import prepare_model


@dataclass
class ObservedSeq:
    """What the MTP head reads of one sequence of the step just run (picklable; stands in for
    a :class:`~atlas_core.engine.sequence.Sequence` in :meth:`MTPProposer.observe`).

    Attributes:
        seq_id: the sequence.
        length: its length after the step's accepted tokens were appended.
        is_finished: it finished in that step (the head skips it).
        window_start: position of ``window[0]``.
        window: the tokens the head reads (``window_start .. window_start + m``).
        block_table: its KV blocks, including any the front allocated for chained drafts.
    """

    seq_id: int
    length: int
    is_finished: bool
    window_start: int
    window: list[int]
    block_table: list[int]

    def __len__(self) -> int:
        return self.length

    def token_id_at(self, i: int) -> int:
        return self.window[i - self.window_start]


class _TablesOnly:
    """The worker's block manager for :class:`MTPProposer`: the front allocated every block
    the head may use before sending its work, so nothing more can be allocated here and a
    position has room exactly when the table reaches it (as it did on the front)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size

    def can_allocate(self, seq: Any, num_tokens: int) -> bool:
        return False

    def allocate(self, seq: Any, num_tokens: int) -> None:
        raise AssertionError("the front allocates the MTP head's blocks")


def observed(layout: list[tuple[Any, int, int]]) -> list[tuple[ObservedSeq, int, int]]:
    """``layout`` (``(seq, start, num_tokens)`` in row order) with each sequence reduced to
    the tokens the head reads."""
    out = []
    for seq, start, n in layout:
        m = 0 if seq.is_finished else max(0, min(n, len(seq) - start - 1))
        window = seq.tokens_range(start + 1, start + 1 + m) if m else []
        out.append((ObservedSeq(seq.seq_id, len(seq), seq.is_finished, start + 1, window,
                                list(seq.block_table) if m else []), start, n))
    return out


class RemoteMTPProposer:
    """The front's MTP proposer: drafts come from the workers' heads.

    Args:
        executor: the :class:`~atlas_core.parallel.executor.ParallelExecutor`.
        block_manager: the engine's KV blocks.
        max_drafts: the configured ``num_speculative_tokens``.
    """

    def __init__(self, executor: Any, block_manager: Any, max_drafts: int) -> None:
        self.executor, self.block_manager, self.max_drafts = executor, block_manager, max_drafts
        self.drafts: dict[int, tuple[int, list[int]]] = {}

    def propose(self, seq: Any, num_tokens: int) -> list[int]:
        """The drafts the workers computed for ``seq`` at its current length."""
        length, drafts = self.drafts.get(seq.seq_id, (-1, []))
        return drafts[:num_tokens] if length == len(seq) else []

    def observe(self, layout: list[tuple[Any, int, int]]) -> None:
        """Have every rank run the head over the step just completed; keep rank 0's drafts."""
        self.drafts = {}
        self._allocate_chain(layout)
        work = observed(layout)  # with block tables that reach every chained draft
        if not any(o.window for o, _, _ in work):
            return
        self.drafts = self.executor.observe(work)

    def _allocate_chain(self, layout: list[tuple[Any, int, int]]) -> None:
        # MTPProposer._chain's KV allocation, in its order: round r drafts at position
        # p + 1 + r for every sequence still drafting, which stops at its first failure.
        bm, active = self.block_manager, []
        for seq, start, n in layout:
            m = 0 if seq.is_finished else min(n, len(seq) - start - 1)
            if m > 0 and start + m == len(seq) - 1:  # the head reaches its last position
                active.append((seq, len(seq) - 2))
        for step in range(self.max_drafts - 1):
            kept = []
            for seq, p in active:
                position = p + 1 + step
                if position < len(seq.block_table) * bm.block_size:
                    kept.append((seq, p))
                elif bm.can_allocate(seq, position + 1):
                    bm.allocate(seq, position + 1)
                    kept.append((seq, p))
            active = kept


class WorkerSpeculation:
    """A worker's side of speculative decoding (see the module docstring).

    Args:
        config: the engine's ``speculative_config`` (``None``: off).
        model: this rank's model.
    """

    def __init__(self, config: Any, model: Any) -> None:
        self.config, self.model = config, model
        self.proposer: MTPProposer | None = None
        # before the KV cache is planned: the head's attention gets its pool on every rank
        prepare_model(model, config)

    def bind(self, runner: Any) -> None:
        """Start drafting with ``runner`` (after the KV cache is allocated)."""
        config = self.config
        if config is None:
            return
        if config.verify_graphs:
            runner.enable_verify_graphs(config.num_speculative_tokens + 1,
                                        config.disable_by_batch_size)
        if config.method == "mtp":
            self.proposer = MTPProposer(self.model, self.model.mtp, runner.backend,
                                        _TablesOnly(runner.kv.block_size),
                                        config.num_speculative_tokens,
                                        lambda: runner.last_hidden)

    def observe(self, work: list[tuple[ObservedSeq, int, int]]) -> dict:
        """Run the head over the front's ``work``; the drafts by sequence id."""
        if self.proposer is None:
            raise ValueError("the engine asked for MTP drafts, but this worker was started "
                             "without the mtp speculative method")
        self.proposer.observe(work)
        return self.proposer.drafts
