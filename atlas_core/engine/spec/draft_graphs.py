"""MTP draft rounds replayed from graphs: one per batch bucket (issue #27, ``draft_graphs``).

A draft round is the MTP head's forward over one new position per sequence, the shared
``lm_head`` and the argmax: every chained draft after the first, and the first too when the
step just run was a plain decode step (each sequence computed one position, whose next token is
now known). Run eagerly a round pays one launch per op of a whole decoder block for a handful of
rows, K - 1 to K times a step; captured, it costs one launch. Rounds of any other shape (prompt
chunks, a verify step's accepted runs) stay eager (:mod:`atlas_core.engine.spec.mtp`).

The graphs read only static buffers of this object: input ids, positions, slots, ``seq_lens``
and block tables (uploaded from host buffers before each replay) and the head's input hidden
rows (a device copy of the rows the round starts from). Rows past the batch are padding, as in
decode graphs: slot ``-1`` (no KV write), ``seq_len`` 1 over an all-zero block table. A CUDA
graph holds addresses, not arrays, so each graph's holder keeps every view and the step
metadata it was captured with (the session 16 NaN bug came from arrays freed after capture).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.interfaces.metadata import StepMetadata

#: int32 per-row inputs uploaded before every replay (``block_tables`` is 2-D, uploaded too).
_ROW_FIELDS = ("input_ids", "positions", "slot_mapping", "seq_lens")


class DraftGraphs:
    """The captured draft rounds of one MTP head, keyed by batch bucket.

    Args:
        model: the CausalLM (``compute_logits`` with the shared head).
        head: the MTP module (``forward(input_ids, hidden, meta) -> hidden``).
        backend: a GpuBackend with ``supports_graphs``.
        block_size: tokens per KV block.
        buckets: batch sizes to capture, ascending (the runner's decode buckets).
        max_blocks_per_seq: width of the captured block tables.
        max_seq_len: longest context a captured round serves (the attention's bound).
    """

    def __init__(self, model: Any, head: Any, backend: Any, block_size: int, buckets: list[int],
                 max_blocks_per_seq: int, max_seq_len: int) -> None:
        self.model, self.head, self.backend = model, head, backend
        self.block_size, self.buckets = block_size, list(buckets)
        self.max_blocks_per_seq, self.max_seq_len = max_blocks_per_seq, max_seq_len
        n = self.buckets[-1]
        self.host = {name: np.zeros(n, np.int32) for name in _ROW_FIELDS}
        self.host["block_tables"] = np.zeros((n, max_blocks_per_seq), np.int32)
        # constant over every round: one query row per sequence, each row's logits computed
        self.host["cu_seqlens_q"] = np.arange(n + 1, dtype=np.int32)
        self.host["logits_indices"] = np.arange(n, dtype=np.int32)
        self.host["state_indices"] = np.full(n, -1, np.int32)
        self.device = {name: backend.from_host(a) for name, a in self.host.items()}
        self._widths = [0] * n  # block-table entries written in each host row
        self.hidden: Any = None  # [n, hidden_size] input rows, allocated at the first round
        self.graphs: dict[int, tuple] = {}
        self.num_replays = 0

    def fits(self, runs: list[tuple[Any, int, int]]) -> bool:
        """Whether a round over ``runs`` (``(seq, start, num_positions)``) can replay: one
        position per sequence, within the largest bucket, the captured table width and the
        context bound."""
        if not runs or len(runs) > self.buckets[-1]:
            return False
        return all(m == 1 and len(seq.block_table) <= self.max_blocks_per_seq
                   and start + 1 <= self.max_seq_len for seq, start, m in runs)

    def step(self, runs: list[tuple[Any, int, int]], ids: list[int], hidden: Any,
             rows: list[int]) -> tuple[Any, np.ndarray]:
        """Replay the round of ``runs`` (:meth:`fits`).

        Args:
            runs: ``(seq, position, 1)`` per sequence, in row order.
            ids: the token after each position (the head's input ids).
            hidden: device ``[*, hidden_size]``; row ``rows[r]`` is sequence ``r``'s input.
            rows: which rows of ``hidden`` the round starts from.

        Returns:
            The head's output (device ``[bucket, hidden_size]``, rows past ``len(runs)`` are
            padding; rewritten by the bucket's next replay) and the host drafts ``[len(runs)]``.
        """
        be, n = self.backend, len(runs)
        bucket = next(b for b in self.buckets if b >= n)
        if self.hidden is None:
            self.hidden = be.zeros((self.buckets[-1], hidden.shape[-1]), hidden.dtype)
        self._ensure(bucket)
        self._fill(runs, ids, bucket)
        if list(rows) == list(range(n)):
            src = hidden[:n]
        else:
            src = be.ops.embedding(be.from_host(np.asarray(rows, np.int32)), hidden)
        be.copy_many(self._uploads(bucket), [(self.hidden[:n], src)])
        graph, holder = self.graphs[bucket]
        graph.replay()
        self.num_replays += 1
        return holder["hidden"], be.to_host(holder["tokens"])[:n]

    def _fill(self, runs: list[tuple[Any, int, int]], ids: list[int], bucket: int) -> None:
        # Real rows first, then padding up to the bucket (slot -1, one-token context, no table).
        h, bs, n = self.host, self.block_size, len(runs)
        h["input_ids"][:n] = ids
        for b, (seq, p, _) in enumerate(runs):
            h["positions"][b] = p
            h["slot_mapping"][b] = seq.block_table[p // bs] * bs + p % bs
            h["seq_lens"][b] = p + 1
            self._write_table(b, seq.block_table)
        for name, value in (("input_ids", 0), ("positions", 0), ("slot_mapping", -1),
                            ("seq_lens", 1)):
            h[name][n:bucket] = value
        for b in range(n, bucket):
            self._write_table(b, ())

    def _write_table(self, b: int, table) -> None:
        k, width = len(table), self._widths[b]
        self.host["block_tables"][b, :k] = table
        if width > k:
            self.host["block_tables"][b, k:width] = 0
        self._widths[b] = k

    def _uploads(self, bucket: int) -> list[tuple[Any, np.ndarray]]:
        names = (*_ROW_FIELDS, "block_tables")
        return [(self.device[name][:bucket], self.host[name][:bucket]) for name in names]

    def _ensure(self, bucket: int) -> None:
        # Captured over all-padding inputs: a backend may run the round while capturing (cuda
        # does, to size the graph's workspace), and padding rows write no KV.
        if bucket in self.graphs:
            return
        self._fill([], [], bucket)
        self.backend.copy_many(self._uploads(bucket))
        self.graphs[bucket] = self._capture(bucket)

    def _metadata(self, views: dict, bucket: int) -> StepMetadata:
        host = {name: self.host[name][:bucket + (name == "cu_seqlens_q")] for name in self.host}
        return StepMetadata(
            num_tokens=bucket, num_seqs=bucket, positions=views["positions"],
            slot_mapping=views["slot_mapping"], cu_seqlens_q=views["cu_seqlens_q"],
            seq_lens=views["seq_lens"], block_tables=views["block_tables"],
            logits_indices=views["logits_indices"], state_indices=views["state_indices"],
            max_seqlen_q=1, max_seq_len=self.max_seq_len, block_size=self.block_size,
            is_decode=True, host=host)

    def _capture(self, bucket: int) -> tuple:
        """``(graph, holder)`` of the round of ``bucket``; the holder gets ``hidden`` (the
        head's output) and ``tokens`` (the argmax), and keeps the views, the input hidden rows
        and the metadata (with whatever a layer caches on it) as long as the graph."""
        views = {name: arr[:bucket + (name == "cu_seqlens_q")]
                 for name, arr in self.device.items()}
        hidden_in = self.hidden[:bucket]
        meta = self._metadata(views, bucket)
        holder: dict = {"views": views, "hidden_in": hidden_in, "meta": meta}
        model, head, ops = self.model, self.head, self.backend.ops

        def draft_round():
            out = holder["hidden"] = head.forward(views["input_ids"], hidden_in, meta)
            holder["tokens"] = ops.argmax(model.compute_logits(out, views["logits_indices"]))

        return self.backend.capture(draft_round), holder
