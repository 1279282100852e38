"""Speculative verify steps replayed from graphs: one per (batch bucket, ``K + 1``).

A verify step gives every sequence its last token and up to ``K`` drafts. Run eagerly it pays
one launch per op; captured, it costs about one decode step. The step shape must be static, so
every sequence gets exactly ``width = K + 1`` query rows (``cu_seqlens_q`` = multiples of
``width``): a sequence with fewer drafts this step (the n-gram found fewer, the gate lowered
``K``) is padded with rows that write no KV (slot ``-1``), no recurrent state (state index
``-1``, copies of the scratch row onto itself) and whose logits are ignored, as padding rows of
decode graphs are. Padding rows come after a sequence's real rows, so causal attention keeps
real rows from seeing them (``seq_lens`` counts the full ``width``; the decode kernel puts row
``i`` at ``seq_len - width + i``).

Everything that changes per step is uploaded into the runner's static buffers before replay:
input ids, positions, slots, block tables, ``seq_lens``, sampler params (``width`` rows a
sequence) and, on hybrid models, the per-position state rows (:class:`SpecVerifyRows`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.engine.sampler import LogitsRow, Sampler
from atlas_core.engine.scheduler import SchedulerOutput
from atlas_core.interfaces.metadata import SpecVerifyRows

#: Host/device int32 buffers of the per-position state rows, position-major (``j * B + b``).
_STATE_FIELDS = ("spec_src", "spec_dst", "spec_state", "spec_lens")


class VerifyGraphs:
    """The verify graphs of one :class:`~atlas_core.engine.model_runner.ModelRunner`.

    Args:
        runner: the runner (its buffers, backend, model, sampler and buckets).
        width: ``K + 1`` query rows per sequence.
        max_batch: most sequences of a verify step (``disable_by_batch_size``); larger
            buckets are not captured by :meth:`capture_all`.
    """

    def __init__(self, runner: Any, width: int, max_batch: int) -> None:
        self.runner, self.width = runner, width
        self.max_batch = max_batch
        self.graphs: dict[tuple[int, int], tuple] = {}
        self.scratch: dict = {}
        self.pending_warm_up = False
        kv = runner.kv
        # The last spec state row is the inert copies' scratch (SpeculativeConfig.state_rows).
        self.scratch_row = kv.num_state_rows - 1 if runner.state_pools and kv.num_spec_state_rows \
            else None
        size = runner.max_tokens + 1
        self.host = {name: np.zeros(size, np.int32) for name in _STATE_FIELDS}
        self.device = {name: runner.backend.from_host(a) for name, a in self.host.items()}

    def buckets(self) -> list[int]:
        """Batch buckets a verify step can take (up to the first one holding ``max_batch``)."""
        out = []
        for b in self.runner.buckets:
            if b * self.width > self.runner.max_tokens:
                break
            out.append(b)
            if b >= self.max_batch:
                break
        return out

    def fits(self, sched: SchedulerOutput, rows_of: dict, rows: list[LogitsRow]) -> bool:
        """Whether ``sched`` is a verify step the graphs run: every sequence decodes its last
        token plus at most ``K`` drafts, every row samples, no host-side sampling work."""
        r = self.runner
        if not any(s.draft_token_ids for s in sched.scheduled) or Sampler.needs_eager(rows):
            return False
        buckets = self.buckets()
        if not buckets or len(sched.scheduled) > buckets[-1]:
            return False
        if r.state_pools and (self.scratch_row is None or not sched.spec_state_rows):
            return False
        limit = r.max_blocks_per_seq * r.kv.block_size
        for s in sched.scheduled:
            n = s.num_tokens
            if (n != 1 + len(s.draft_token_ids) or n > self.width or s.seq.mm is not None
                    or s.start != len(s.seq) - 1 or s.start + self.width > limit
                    or len(rows_of.get(s.seq.seq_id, ())) != n):
                return False
        return all(row.samples for row in rows)

    def run(self, sched: SchedulerOutput, rows_of: dict):
        """Fill, upload and replay; returns device token ids, one per row of ``rows_of`` in
        sequence order (the padding rows dropped on the host by :meth:`results_order`)."""
        r, w = self.runner, self.width
        bucket = next(b for b in self.buckets() if b >= len(sched.scheduled))
        self.ensure(bucket)
        self.fill(sched, bucket)
        copies: list = []
        r._upload(bucket * w, bucket, bucket * w, copies)
        if r.state_pools:
            copies.extend((self.device[n][:bucket * w], self.host[n][:bucket * w])
                          for n in _STATE_FIELDS)
        padded: list = [None] * (bucket * w)
        for b, s in enumerate(sched.scheduled):
            for j, row in enumerate(rows_of[s.seq.seq_id]):
                padded[b * w + j] = row
        r.sampler.upload_params(padded, bucket * w, copies=copies)
        r.backend.copy_many(copies)
        return self.replay(bucket)

    def results_order(self, sched: SchedulerOutput) -> list[int]:
        """Token rows of the graph's output that belong to real rows, in ``rows_of`` order."""
        return [b * self.width + j for b, s in enumerate(sched.scheduled)
                for j in range(s.num_tokens)]

    def fill(self, sched: SchedulerOutput, bucket: int) -> None:
        """Write the step's inputs (``width`` rows per sequence, padded) into host buffers."""
        r, w = self.runner, self.width
        h, bs, n = r.host, r.kv.block_size, len(sched.scheduled)
        t = bucket * w
        h["slot_mapping"][:t] = -1
        h["input_ids"][:t] = 0
        h["positions"][:t] = 0
        for b, s in enumerate(sched.scheduled):
            seq, k, t0 = s.seq, s.num_tokens, b * w
            pos = np.arange(s.start, s.start + k, dtype=np.int64)
            h["input_ids"][t0:t0 + k] = [seq.token_id_at(s.start)] + list(s.draft_token_ids)
            h["positions"][t0:t0 + k] = pos
            h["positions"][t0 + k:t0 + w] = s.start + k - 1
            table = np.asarray(seq.block_table, np.int64)
            h["slot_mapping"][t0:t0 + k] = table[pos // bs] * bs + pos % bs
            h["seq_lens"][b] = s.start + w
            r._write_table(b, seq)
        h["seq_lens"][n:bucket] = w
        h["state_indices"][:n] = [s.seq.state_slot for s in sched.scheduled]
        h["state_indices"][n:bucket] = -1
        for b in range(n, bucket):
            r._clear_table(b)
        h["cu_seqlens_q"][:bucket + 1] = r._arange[:bucket + 1] * w
        h["logits_indices"][:t] = r._arange[:t]
        if r.windowed:
            h["window_slot_mapping"][:t] = -1
            for b, s in enumerate(sched.scheduled):
                pos = np.arange(s.start, s.start + s.num_tokens, dtype=np.int64)
                window = np.asarray(s.seq.window_block_table, np.int64)
                h["window_slot_mapping"][b * w:b * w + s.num_tokens] = \
                    window[pos // bs] * bs + pos % bs
        if r.state_pools:
            self._fill_state(sched, bucket)

    def _fill_state(self, sched: SchedulerOutput, bucket: int) -> None:
        # Position j of sequence b: copy src -> dst, then update dst (the rows of the eager
        # path's spec_state_rows); inert entries copy the scratch row onto itself.
        h, w, x = self.host, self.width, self.scratch_row
        for name in ("spec_src", "spec_dst"):
            h[name][:bucket * w] = x
        h["spec_state"][:bucket * w] = -1
        h["spec_lens"][:bucket * w] = 1
        rows_of = sched.spec_state_rows or {}
        for b, s in enumerate(sched.scheduled):
            slot = s.seq.state_slot
            dst = rows_of.get(s.seq.seq_id, [slot])
            for j in range(s.num_tokens):
                i = j * bucket + b
                h["spec_src"][i] = slot if j == 0 else dst[j - 1]
                h["spec_dst"][i] = h["spec_state"][i] = dst[j]
                h["spec_lens"][i] = s.start + j + 1

    def ensure(self, bucket: int) -> None:
        """Capture the graph of ``bucket`` over all-padding inputs (nothing is written)."""
        key = (bucket, self.width)
        if key in self.graphs:
            return
        r = self.runner
        self.fill(SchedulerOutput(), bucket)
        r._upload(bucket * self.width, bucket, bucket * self.width)
        if r.state_pools:
            r.backend.copy_many([(self.device[n][:bucket * self.width],
                                  self.host[n][:bucket * self.width]) for n in _STATE_FIELDS])
        r.sampler.upload_params([], bucket * self.width)
        self.graphs[key] = self._capture(bucket)

    def capture_all(self) -> None:
        """Capture every bucket's graph (the warm-up, on the engine's step thread)."""
        for bucket in self.buckets():
            self.ensure(bucket)

    def replay(self, bucket: int):
        graph, holder = self.graphs[(bucket, self.width)]
        graph.replay()
        self.runner.num_graph_replays += 1
        self.runner.num_verify_replays += 1
        self.runner.last_hidden = holder["hidden"]
        return holder["tokens"]

    def _layout(self, bucket: int) -> SpecVerifyRows:
        # Static index arrays are uploaded once here, outside the captured work. Only the
        # step's metadata references them: _capture keeps that metadata with the graph.
        be, w = self.runner.backend, self.width
        rows = [be.from_host(np.arange(bucket, dtype=np.int32) * w + j) for j in range(w)]
        order = (np.arange(w, dtype=np.int32)[None, :] * bucket
                 + np.arange(bucket, dtype=np.int32)[:, None]).reshape(-1)
        views = {n: [self.device[n][j * bucket:(j + 1) * bucket] for j in range(w)]
                 for n in _STATE_FIELDS}
        return SpecVerifyRows(width=w, rows=rows, src=views["spec_src"], dst=views["spec_dst"],
                              state=views["spec_state"], seq_lens=views["spec_lens"],
                              cu_seqlens=be.from_host(np.arange(bucket + 1, dtype=np.int32)),
                              order=be.from_host(order), scratch=self.scratch)

    def _capture(self, bucket: int) -> tuple:
        r, w = self.runner, self.width
        t = bucket * w
        sizes = {"cu_seqlens_q": bucket + 1, "seq_lens": bucket, "block_tables": bucket,
                 "state_indices": bucket, "window_block_tables": bucket}
        views = {name: r.device[name][:sizes.get(name, t)] for name in r.device}
        meta = r._metadata(views, t, bucket, t, w, r.max_seq_len, False)
        # A graph replays with the host values of the capture step (all padding): a layer that
        # sizes its work from meta.host (MLA's expanded path: sum(seq_lens) context rows) would
        # keep those sizes in every replay. Without host copies it takes its device-only path.
        meta.host = {}
        if r.state_pools:
            meta.spec_verify = self._layout(bucket)
        params = {name: arr[:t] for name, arr in r.sampler.device.items()}
        # the holder keeps meta (and the layout's index arrays only it references) alive
        return r.capture_step(views, meta, params)
