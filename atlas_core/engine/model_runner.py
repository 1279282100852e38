"""ModelRunner: one engine step on the device — metadata upload, forward, logits, sampling.

Inputs go through static device buffers sized at start-up (``copy_from_host`` into views), so a
step allocates no metadata. Decode-only steps on a backend with ``supports_graphs`` replay a
graph captured once per batch-size bucket (1, 2, 4, … up to ``max_batch_size``); padding rows
write to slot -1 and attend over a dummy block table (:mod:`atlas_core.engine.decode_graphs`).
Speculative verify steps (``K + 1`` query rows a sequence) replay graphs of their own, see
:mod:`atlas_core.engine.verify_graphs`. Exactly one device->host transfer happens per step when
no logprobs are asked: the sampled token ids.

Recurrent layers (hybrid models) get pools ``name -> [num_state_rows, *shape]`` (live slots,
then prefix snapshots; allocated with the KV pools, :mod:`atlas_core.engine.kv_alloc`);
``state_indices`` carries each sequence's slot (``-1`` on padding rows), and the scheduler's
snapshot restores / saves are row copies around the forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from atlas_core.engine.decode_graphs import DecodeGraphsMixin
from atlas_core.engine.kv_alloc import allocate_kv_caches
from atlas_core.engine.kv_sizing import KVCacheConfig
from atlas_core.engine.outputs import TokenLogprob
from atlas_core.engine.sampler import LogitsRow, Sampler
from atlas_core.engine.scheduler import SchedulerOutput
from atlas_core.engine.verify_graphs import VerifyGraphs
from atlas_core.interfaces.gpu_backend import HostRead
from atlas_core.interfaces.metadata import StepMetadata

_I32_FIELDS = ("input_ids", "positions", "slot_mapping", "cu_seqlens_q", "seq_lens",
               "logits_indices", "state_indices")


@dataclass
class StepResult:
    """What one step produced for one logits row."""

    row: LogitsRow
    token_id: int
    logprob: TokenLogprob | None


@dataclass
class PendingStep:
    """A decode step launched on the device whose sampled ids the host has not read yet.

    ``tokens`` is the device int32 ``[batch]`` of sampled ids (the next chained step copies
    from it before its own replay); ``read`` the queued device->host copy of them.
    """

    sched: SchedulerOutput
    rows: list[LogitsRow]
    tokens: Any
    read: HostRead

    def results(self) -> list[StepResult]:
        """Wait for the sampled ids (the step's one host sync) and pair them with the rows."""
        ids = self.read.wait()
        return [StepResult(r, int(ids[i]), None) for i, r in enumerate(self.rows)]


class ModelRunner(DecodeGraphsMixin):
    """Owns the KV pools and the step buffers of one model on one backend.

    Args:
        model: a CausalLM (``forward``, ``compute_logits``, ``kv_cache_specs``, ``bind_kv_caches``).
        backend: its GpuBackend.
        kv: the planned KV pool.
        max_batch_size: most sequences per step.
        max_prefill_tokens: most prefill tokens per step.
        max_seq_len: longest sequence.
        use_graphs: capture decode graphs when the backend supports them.
    """

    def __init__(self, model, backend, kv: KVCacheConfig, max_batch_size: int,
                 max_prefill_tokens: int, max_seq_len: int, use_graphs: bool = True) -> None:
        self.model, self.backend, self.kv = model, backend, kv
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.max_tokens = max_prefill_tokens + max_batch_size
        self.max_blocks_per_seq = -(-max_seq_len // kv.block_size)
        self.kv_caches, self.state_pools = allocate_kv_caches(model, backend, kv)
        model.bind_kv_caches(self.kv_caches)
        rows = self.max_tokens
        self.host = {name: np.zeros(rows + 1, np.int32) for name in _I32_FIELDS}
        self.host["block_tables"] = np.zeros((max_batch_size, self.max_blocks_per_seq), np.int32)
        self.windowed = kv.window_pool is not None
        if self.windowed:
            self.host["window_slot_mapping"] = np.zeros(rows + 1, np.int32)
            self.host["window_block_tables"] = np.zeros_like(self.host["block_tables"])
        self.device = {name: backend.from_host(arr) for name, arr in self.host.items()}
        self._arange = np.arange(rows + 1, dtype=np.int32)
        self._table_owner: list[tuple | None] = [None] * max_batch_size
        self.sampler = Sampler(backend, rows, model.vocab_size)
        self._init_decode_graphs(use_graphs, max_batch_size)
        self.num_verify_replays = 0
        self.num_chained_steps = 0
        self.verify: VerifyGraphs | None = None
        self._last_hidden: Any = None
        self._hidden_rows: list[int] | None = None
        self.mm_chunks: list = []

    @property
    def last_hidden(self) -> Any:
        """Final hidden states of the last step's rows, packed by sequence (a verify graph's
        padding rows gathered out on first read: only MTP drafting reads them)."""
        if self._hidden_rows is not None:
            idx = self.backend.from_host(np.asarray(self._hidden_rows, np.int32))
            self._last_hidden = self.backend.ops.embedding(idx, self._last_hidden)
            self._hidden_rows = None
        return self._last_hidden

    @last_hidden.setter
    def last_hidden(self, value: Any) -> None:
        self._last_hidden, self._hidden_rows = value, None

    def enable_verify_graphs(self, width: int, max_batch: int) -> None:
        """Replay speculative verify steps of up to ``width`` rows a sequence and up to
        ``max_batch`` sequences from graphs (no-op without graph support)."""
        if self.use_graphs:
            self.verify = VerifyGraphs(self, width, max_batch)

    def warm_verify_graphs(self) -> None:
        """Capture every verify graph at the start of the next step (on the engine's thread,
        which owns the device stream); see :func:`atlas_core.engine.health.warm_graph_buckets`."""
        if self.verify is not None:
            self.verify.pending_warm_up = True

    def copy_state_rows(self, copies: list[tuple[int, int]]) -> None:
        """Copy recurrent-state rows ``src -> dst`` in every pool (snapshot restore / save)."""
        for src, dst in copies:
            for pool in self.state_pools:
                self.backend.copy_(pool[dst:dst + 1], pool[src:src + 1])

    def execute(self, sched: SchedulerOutput, rows_of: dict[int, list[LogitsRow]]) -> list[StepResult]:
        """Run one step; ``rows_of[seq_id]`` lists each scheduled sequence's logits rows."""
        self._warm_verify()
        self.backend.reset_workspace()
        rows = [r for s in sched.scheduled for r in rows_of.get(s.seq.seq_id, [])]
        self.copy_state_rows(sched.restores)
        if self.use_graphs and sched.is_decode_only and not Sampler.needs_eager(rows):
            tokens = self._run_decode_graph(sched, rows)
            handle = None
        elif self.verify is not None and self.verify.fits(sched, rows_of, rows):
            order = self.verify.results_order(sched)
            tokens = self.verify.run(sched, rows_of)
            self._last_hidden, self._hidden_rows = self._last_hidden, order
            tokens_host = self.backend.to_host(tokens)[order]
            self.copy_state_rows(sched.snapshots)
            return [StepResult(r, int(tokens_host[i]), None) for i, r in enumerate(rows)]
        else:
            tokens, raw_logits = self._run_eager(sched, rows_of, rows)
            handle = self.sampler.logprobs(raw_logits, rows, tokens)
        self.copy_state_rows(sched.snapshots)
        tokens_host = self.backend.to_host(tokens)
        logprobs = self.sampler.fetch_logprobs(handle, rows, tokens_host)
        return [StepResult(r, int(tokens_host[i]), logprobs[i]) for i, r in enumerate(rows)]

    def launch_decode(self, sched: SchedulerOutput, rows: list[LogitsRow],
                      prev: PendingStep | None = None) -> PendingStep:
        """Queue a decode step (one sampling row per sequence) without waiting for it.

        With ``prev`` (async scheduling), ``sched`` was planned before ``prev``'s tokens were
        known: every sequence of ``sched`` was in ``prev``, its input id is copied on the device
        from ``prev.tokens`` and its sampling step counts the token not yet appended. Inputs
        are not double buffered: the uploads and copies queue on the backend's one stream
        behind ``prev``'s replay, which has read its inputs by the time they land.
        """
        self._warm_verify()
        self.backend.reset_workspace()
        batch = len(sched.scheduled)
        bucket = next(b for b in self.buckets if b >= batch)
        width = self._graph_width(sched)
        self._ensure_graph(bucket)
        self._fill_decode(sched, bucket, chained=prev is not None)
        copies: list = []
        self._upload(bucket, bucket, bucket, copies, device_ids=batch if prev is not None else 0,
                     skip=self._narrow_skip(width))
        if width:
            self._narrow_upload(width, copies)
        self.sampler.upload_params(rows, bucket, ahead=int(prev is not None), copies=copies)
        chained: list = []
        if prev is not None:
            self._chain_inputs(sched, prev, chained)
            self.num_chained_steps += 1
        self.backend.copy_many(copies, chained)
        tokens = self._replay(bucket, width)[:batch]
        return PendingStep(sched, rows, tokens, self.backend.to_host_async(tokens))

    def _warm_verify(self) -> None:
        if self.verify is not None and self.verify.pending_warm_up:
            self.verify.pending_warm_up = False
            self.verify.capture_all()

    def _chain_inputs(self, sched: SchedulerOutput, prev: PendingStep, copies: list) -> None:
        """Append ``(input ids rows, prev.tokens rows)`` device pairs to ``copies``."""
        # Device copies prev.tokens -> input_ids, one per run of rows that stay consecutive
        # (the host upload left those rows out: copy_many's destinations are disjoint).
        where = {s.seq.seq_id: i for i, s in enumerate(prev.sched.scheduled)}
        src = [where[s.seq.seq_id] for s in sched.scheduled]
        ids, j = self.device["input_ids"], 0
        n = len(src)
        while j < n:
            k = j + 1
            while k < n and src[k] == src[k - 1] + 1:
                k += 1
            copies.append((ids[j:k], prev.tokens[src[j]:src[j] + k - j]))
            j = k

    def _fill(self, sched: SchedulerOutput, rows_of: dict[int, list[LogitsRow]],
              num_seqs: int) -> tuple[int, int]:
        """Write the step's inputs into the host buffers; returns ``(num_tokens, num_rows)``."""
        self.mm_chunks = []
        if sched.is_decode_only and all(len(rows_of.get(s.seq.seq_id, ())) == 1
                                        for s in sched.scheduled):
            return self._fill_decode(sched, num_seqs)
        h, bs = self.host, self.kv.block_size
        t = num_rows = 0
        h["cu_seqlens_q"][0] = 0
        for b, s in enumerate(sched.scheduled):
            seq, n = s.seq, s.num_tokens
            pos = np.arange(s.start, s.start + n, dtype=np.int64)
            table = np.asarray(seq.block_table, np.int64)
            drafts = s.draft_token_ids
            h["input_ids"][t:t + n] = seq.tokens_range(s.start, s.start + n - len(drafts)) + drafts
            h["positions"][t:t + n] = pos
            if seq.mm is not None:
                h["positions"][t:t + n] = seq.mm.positions(s.start, n)
                self.mm_chunks.append((t, s.start, n, seq.mm))
            h["slot_mapping"][t:t + n] = table[pos // bs] * bs + pos % bs
            if self.windowed:
                window = np.asarray(seq.window_block_table, np.int64)
                h["window_slot_mapping"][t:t + n] = window[pos // bs] * bs + pos % bs
            h["seq_lens"][b] = s.start + n
            self._write_table(b, seq)
            seq_rows = rows_of.get(seq.seq_id, [])
            h["logits_indices"][num_rows:num_rows + len(seq_rows)] = np.arange(t + n - len(seq_rows), t + n)
            num_rows += len(seq_rows)
            t += n
            h["cu_seqlens_q"][b + 1] = t
        h["state_indices"][:num_seqs] = [s.seq.state_slot for s in sched.scheduled]
        return t, num_rows

    def _fill_decode(self, sched: SchedulerOutput, num_seqs: int,
                     chained: bool = False) -> tuple[int, int]:
        # One query row per sequence; rows past the batch are padding (slot -1, dummy table).
        # Chained steps get their input ids by a device copy after the upload.
        h, bs, n = self.host, self.kv.block_size, len(sched.scheduled)
        starts = [s.start for s in sched.scheduled]
        h["input_ids"][:n] = 0 if chained else [s.seq.token_id_at(s.start) for s in sched.scheduled]
        h["positions"][:n] = starts
        for b, s in enumerate(sched.scheduled):
            if s.seq.mm is not None:
                h["positions"][b] += s.seq.mm.position_offset
        h["slot_mapping"][:n] = [s.seq.block_table[p // bs] * bs + p % bs
                                 for s, p in zip(sched.scheduled, starts)]
        if self.windowed:
            h["window_slot_mapping"][:n] = [s.seq.window_block_table[p // bs] * bs + p % bs
                                            for s, p in zip(sched.scheduled, starts)]
            h["window_slot_mapping"][n:num_seqs] = -1
        h["seq_lens"][:n] = starts
        h["seq_lens"][:n] += 1
        for b, s in enumerate(sched.scheduled):
            self._write_table(b, s.seq)
        h["state_indices"][:n] = [s.seq.state_slot for s in sched.scheduled]
        padding = (("input_ids", 0), ("positions", 0), ("slot_mapping", -1), ("seq_lens", 1),
                   ("state_indices", -1))
        for name, value in padding:
            h[name][n:num_seqs] = value
        for b in range(n, num_seqs):
            self._clear_table(b)
        for name in ("logits_indices", "cu_seqlens_q"):
            h[name][:num_seqs + 1] = self._arange[:num_seqs + 1]
        return num_seqs, num_seqs

    def _write_table(self, b: int, seq) -> None:
        # Rows keep their owner between steps, so a decode step writes only new block ids.
        table, owner = seq.block_table, self._table_owner[b]
        if owner is not None and owner[:2] == (seq.seq_id, seq.table_epoch) and owner[2] <= len(table):
            written = owner[2]
        else:
            self._clear_table(b)
            written = 0
        if written < len(table):
            self.host["block_tables"][b, written:len(table)] = table[written:]
            if self.windowed:
                self.host["window_block_tables"][b, written:len(table)] = \
                    seq.window_block_table[written:]
        self._table_owner[b] = (seq.seq_id, seq.table_epoch, len(table))

    def _clear_table(self, b: int) -> None:
        owner = self._table_owner[b]
        if owner is not None:
            self.host["block_tables"][b, :owner[2]] = 0
            if self.windowed:
                self.host["window_block_tables"][b, :owner[2]] = 0
            self._table_owner[b] = None

    def _upload(self, num_tokens: int, num_seqs: int, num_rows: int,
                copies: list | None = None, device_ids: int = 0,
                skip: tuple[str, ...] = ()) -> dict:
        """Device views of the step's inputs, copied from the host buffers now or, given
        ``copies``, appended there as ``(device, host)`` pairs for one ``copy_many``; the first
        ``device_ids`` input ids are left out (a chained step copies them on the device), and
        the buffers named in ``skip`` (a narrow decode graph's tables, uploaded apart)."""
        sizes = {"input_ids": num_tokens, "positions": num_tokens, "slot_mapping": num_tokens,
                 "cu_seqlens_q": num_seqs + 1, "seq_lens": num_seqs, "block_tables": num_seqs,
                 "logits_indices": num_rows, "state_indices": num_seqs}
        if self.windowed:
            sizes.update(window_slot_mapping=num_tokens, window_block_tables=num_seqs)
        views = {name: self.device[name][:n] for name, n in sizes.items()}
        pairs = [(self.device[name][device_ids if name == "input_ids" else 0:n],
                  self.host[name][device_ids if name == "input_ids" else 0:n])
                 for name, n in sizes.items() if name not in skip]
        if copies is None:
            self.backend.copy_many(pairs)
        else:
            copies.extend(pairs)
        return views

    def _metadata(self, views: dict, num_tokens: int, num_seqs: int, num_rows: int,
                  max_seqlen_q: int, max_seq_len: int, is_decode: bool) -> StepMetadata:
        sizes = {"input_ids": num_tokens, "positions": num_tokens, "slot_mapping": num_tokens,
                 "cu_seqlens_q": num_seqs + 1, "seq_lens": num_seqs, "block_tables": num_seqs,
                 "logits_indices": num_rows, "state_indices": num_seqs}
        host = {name: self.host[name][:n] for name, n in sizes.items()}
        return StepMetadata(
            num_tokens=num_tokens, num_seqs=num_seqs, positions=views["positions"],
            slot_mapping=views["slot_mapping"], cu_seqlens_q=views["cu_seqlens_q"],
            seq_lens=views["seq_lens"], block_tables=views["block_tables"],
            logits_indices=views["logits_indices"], state_indices=views["state_indices"],
            max_seqlen_q=max_seqlen_q, max_seq_len=max_seq_len, block_size=self.kv.block_size,
            is_decode=is_decode, host=host, window_block_tables=views.get("window_block_tables"),
            window_slot_mapping=views.get("window_slot_mapping"))

    def _run_eager(self, sched: SchedulerOutput, rows_of, rows: list[LogitsRow]):
        num_seqs = len(sched.scheduled)
        num_tokens, num_rows = self._fill(sched, rows_of, num_seqs)
        views = self._upload(num_tokens, num_seqs, num_rows)
        meta = self._metadata(views, num_tokens, num_seqs, num_rows,
                              max(s.num_tokens for s in sched.scheduled),
                              max(s.start + s.num_tokens for s in sched.scheduled),
                              sched.is_decode_only)
        if sched.spec_state_rows:
            meta.spec_state_rows = [sched.spec_state_rows.get(s.seq.seq_id, [s.seq.state_slot])
                                    for s in sched.scheduled]
        meta.multimodal = self.mm_chunks or None
        hidden = self.last_hidden = self.model.forward(views["input_ids"], meta)
        logits = self.model.compute_logits(hidden, views["logits_indices"])
        params = self.sampler.upload_params(rows, num_rows)
        return self.sampler.process(logits, rows, params), logits
