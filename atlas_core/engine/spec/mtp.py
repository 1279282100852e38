"""MTP drafting: the checkpoint's own multi-token-prediction head proposes the next tokens.

An MTP head (Qwen3.5 / Qwen3-Next ``mtp.*``; DeepSeek-V3, Nemotron-3 and MiniMax-M2 ship the
same shape) maps ``[embedding of token p+1; target hidden state at p]`` through one decoder
layer to a hidden state whose logits (the shared ``lm_head``) predict token ``p + 2``. Its
attention layer keeps its own paged KV over the whole sequence, indexed by the sequence's block
table like every other layer.

After every engine step the proposer runs the head over the positions the step computed and
whose next token is now known (prompt chunks, and a verified step's accepted positions), which
fills the head's KV and, at a sequence's last position, gives the first draft; further drafts
chain the head on its own output hidden state and draft. Drafts are the head's argmax (one-hot
drafts keep verification exact, see :mod:`atlas_core.engine.spec.speculator`). With
``draft_graphs`` the rounds of one new position per sequence (every chained draft, and the
first after a plain decode step) replay from graphs (:mod:`atlas_core.engine.spec.draft_graphs`).

The head (``CausalLM.mtp``, usually core's :class:`~atlas_core.model.layers.mtp.MTPHead`)
gives ``forward(input_ids, hidden, meta) -> hidden`` (final-normed, ``[num_tokens,
hidden_size]``) and ``state_spec()`` of its attention layer; the model's ``compute_logits``
gives its logits.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from atlas_core.interfaces.metadata import StepMetadata


class MTPProposer:
    """Drafts from an MTP head, updated after every step.

    Args:
        model: the CausalLM (``compute_logits`` with the shared head).
        head: the MTP module (see the module docstring).
        backend: the GpuBackend.
        block_manager: the engine's KV blocks (chained drafts need slots ahead).
        max_drafts: the configured ``num_speculative_tokens``.
        last_hidden: ``() ->`` the final hidden states of the step just run (the runner's).
        graphs: a :class:`~atlas_core.engine.spec.draft_graphs.DraftGraphs` replaying the
            rounds it fits, or ``None`` (every round eager).
    """

    def __init__(self, model: Any, head: Any, backend: Any, block_manager: Any, max_drafts: int,
                 last_hidden: Callable[[], Any], graphs: Any = None) -> None:
        self.model, self.head, self.backend = model, head, backend
        self.block_manager, self.max_drafts = block_manager, max_drafts
        self.last_hidden = last_hidden
        self.graphs = graphs
        self.drafts: dict[int, tuple[int, list[int]]] = {}

    def propose(self, seq, num_tokens: int) -> list[int]:
        """The drafts computed for ``seq`` at its current length (``[]`` if none)."""
        length, drafts = self.drafts.get(seq.seq_id, (-1, []))
        return drafts[:num_tokens] if length == len(seq) else []

    def observe(self, layout: list[tuple[Any, int, int]]) -> None:
        """Run the head over the step just completed and draft for the sequences it reached.

        Args:
            layout: ``(seq, start, num_tokens)`` of every sequence in the step's forward, in
                row order; each ``seq`` holds the step's accepted tokens already.
        """
        self.drafts = {}
        hidden = self.last_hidden()
        rows, runs, offset = [], [], 0
        for seq, start, n in layout:
            m = 0 if seq.is_finished else min(n, len(seq) - start - 1)
            if m > 0:
                rows.extend(range(offset, offset + m))
                runs.append((seq, start, m))
            offset += n
        if not runs or hidden is None:
            return
        be = self.backend
        ids = [seq.token_id_at(p + 1) for seq, start, m in runs for p in range(start, start + m)]
        if (self.graphs is not None and self.graphs.fits(runs)
                and all(start + 1 == len(seq) - 1 for seq, start, _ in runs)):
            # a plain decode step: the head's first round is a draft round like the chained ones
            out, tokens = self.graphs.step(runs, ids, hidden, rows)
            self._chain([seq for seq, _, _ in runs], [start for _, start, _ in runs], out, tokens)
            return
        out = self.head.forward(self._ids(ids), be.ops.embedding(self._ids(rows), hidden),
                                self._meta(runs))
        ends = np.cumsum([m for _, _, m in runs]) - 1
        wanting = [(i, seq, start + m - 1) for i, (seq, start, m) in enumerate(runs)
                   if start + m == len(seq) - 1]
        if wanting:
            last = be.ops.embedding(self._ids([int(ends[i]) for i, _, _ in wanting]), out)
            self._chain([seq for _, seq, _ in wanting], [p for _, _, p in wanting], last)

    def _chain(self, seqs: list, positions: list[int], hidden: Any,
               tokens: np.ndarray | None = None) -> None:
        # hidden[r]: the head's output at positions[r]; tokens: its argmax (None: not yet
        # computed). Each round drafts one token for the sequences still active.
        be = self.backend
        if tokens is None:
            logits = self.model.compute_logits(hidden, self._ids(range(len(seqs))))
            tokens = be.to_host(be.ops.argmax(logits))
        drafts: list[list[int]] = [[] for _ in seqs]
        active = list(range(len(seqs)))
        for step in range(self.max_drafts):
            for r, i in enumerate(active):
                drafts[i].append(int(tokens[r]))
            nxt = [r for r, i in enumerate(active)
                   if step + 1 < self.max_drafts and self._room(seqs[i], positions[i] + 1 + step)]
            if not nxt:
                break
            active = [active[r] for r in nxt]
            runs = [(seqs[i], positions[i] + 1 + step, 1) for i in active]
            hidden, tokens = self._round(runs, [drafts[i][-1] for i in active], hidden, nxt)
        for seq, d in zip(seqs, drafts):
            self.drafts[seq.seq_id] = (len(seq), d)

    def _round(self, runs: list, ids: list[int], hidden: Any, rows: list[int]):
        """One chained draft round: ``(head output, host argmax drafts)`` of ``runs`` (one
        position each) from rows ``rows`` of ``hidden``, replayed when the graphs fit."""
        if self.graphs is not None and self.graphs.fits(runs):
            return self.graphs.step(runs, ids, hidden, rows)
        be = self.backend
        out = self.head.forward(self._ids(ids), be.ops.embedding(self._ids(rows), hidden),
                                self._meta(runs))
        logits = self.model.compute_logits(out, self._ids(range(len(runs))))
        return out, be.to_host(be.ops.argmax(logits))

    def _room(self, seq, position: int) -> bool:
        # A KV slot for the head at ``position`` (the verify step will need it anyway).
        bm = self.block_manager
        if position < len(seq.block_table) * bm.block_size:
            return True
        if not bm.can_allocate(seq, position + 1):
            return False
        bm.allocate(seq, position + 1)
        return True

    def _ids(self, values) -> Any:
        return self.backend.from_host(np.asarray(list(values), np.int32))

    def _meta(self, runs: list[tuple[Any, int, int]]) -> StepMetadata:
        """The layout of the head's step: ``m`` query positions from ``start`` per sequence."""
        bs, be = self.block_manager.block_size, self.backend
        positions = np.concatenate([np.arange(s, s + m) for _, s, m in runs]).astype(np.int32)
        slots = np.concatenate([np.asarray(seq.block_table, np.int64)[np.arange(s, s + m) // bs]
                                * bs + np.arange(s, s + m) % bs for seq, s, m in runs])
        cu = np.concatenate([[0], np.cumsum([m for _, _, m in runs])]).astype(np.int32)
        width = max(len(seq.block_table) for seq, _, _ in runs)
        tables = np.zeros((len(runs), width), np.int32)
        for b, (seq, _, _) in enumerate(runs):
            tables[b, :len(seq.block_table)] = seq.block_table
        host = {"positions": positions, "slot_mapping": slots.astype(np.int32),
                "cu_seqlens_q": cu, "seq_lens": np.array([s + m for _, s, m in runs], np.int32),
                "block_tables": tables, "logits_indices": cu[1:] - 1,
                "state_indices": np.full(len(runs), -1, np.int32)}
        dev = {name: be.from_host(arr) for name, arr in host.items()}
        return StepMetadata(
            num_tokens=int(cu[-1]), num_seqs=len(runs), positions=dev["positions"],
            slot_mapping=dev["slot_mapping"], cu_seqlens_q=dev["cu_seqlens_q"],
            seq_lens=dev["seq_lens"], block_tables=dev["block_tables"],
            logits_indices=dev["logits_indices"], state_indices=dev["state_indices"],
            max_seqlen_q=max(m for _, _, m in runs), max_seq_len=int(host["seq_lens"].max()),
            block_size=bs, is_decode=all(m == 1 for _, _, m in runs), host=host)
