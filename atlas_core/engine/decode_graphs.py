"""Decode steps replayed from graphs, one per batch-size bucket.

A decode step launches one kernel per op; captured once into a graph (CUDA graphs on the cuda
backend) it costs about one launch. A graph replays a fixed shape, so batches are rounded up to
a bucket (1, 2, 4, … below ``max_batch_size``, then ``max_batch_size``: :func:`batch_buckets`)
and the rows past the batch are padding that writes to slot ``-1``, attends over a dummy block
table and touches no recurrent state. Everything that changes per step goes through the
runner's static buffers, uploaded before the replay.

This is a mixin of :class:`~atlas_core.engine.model_runner.ModelRunner` rather than an object
of its own because the graphs are the runner's step, frozen: they read the runner's buffers,
fill them with its ``_fill`` / ``_upload`` / ``_metadata`` and sample with its sampler, and
their state (``graphs``, ``buckets``, ``num_graph_replays``, :meth:`capture_step`) is read on
the runner by the verify graphs, the MTP draft graphs and the benchmarks.

Batch 1 also gets graphs over narrower block tables (:data:`NARROW_WIDTHS`, tokens; only
widths below ``max_seq_len``), replayed while its sequence fits one: a kernel plans its split
decode from the table's width (a graph holds that plan), so a server whose longest sequence is
40k would otherwise decode a 1k-token chat with the long-context plan (the tensor-core kernel
and its splits instead of the fused-rope CUDA-core kernel: session 25, qwen3-14b at 1k tokens,
8.67 ms a step in 33k-wide tables against 8.02 ms as wide as the context).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from atlas_core.engine.sampler import LogitsRow
from atlas_core.engine.scheduler import SchedulerOutput


#: Block-table widths (tokens) of batch 1's extra decode graphs: the thresholds at which the
#: cuda backend's decode attention changes plan at one query token (``MMA_DECODE_B1_MAX_CTX_ODD``
#: and ``MMA_DECODE_B1_MAX_CTX`` in atlas_cuda.attention_plan). ``ATLAS_DECODE_GRAPH_WIDTHS``
#: (comma-separated tokens, ``0`` for none) overrides them.
NARROW_WIDTHS = (4096, 16384)
NARROW_WIDTHS_ENV = "ATLAS_DECODE_GRAPH_WIDTHS"


def narrow_widths(max_seq_len: int, block_size: int) -> list[int]:
    """Batch 1's narrow graph widths below ``max_seq_len`` (:data:`NARROW_WIDTHS` or
    :data:`NARROW_WIDTHS_ENV`), whole blocks each, narrowest first."""
    raw = os.environ.get(NARROW_WIDTHS_ENV)
    try:
        widths = NARROW_WIDTHS if raw is None else tuple(int(w) for w in raw.split(",") if w.strip())
    except ValueError:
        raise ValueError(f"{NARROW_WIDTHS_ENV}={raw!r}: give token counts separated by commas "
                         "(e.g. 4096,16384), or 0 for none") from None
    return sorted({-(-w // block_size) * block_size for w in widths
                   if 0 < -(-w // block_size) * block_size < max_seq_len})


def batch_buckets(max_batch_size: int) -> list[int]:
    """Decode graph sizes: powers of two below ``max_batch_size``, then ``max_batch_size``."""
    sizes, b = [], 1
    while b < max_batch_size:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch_size]


class DecodeGraphsMixin:
    """Capture and replay of decode graphs for a runner (``backend``, ``model``, ``sampler``,
    ``kv`` config, ``host`` and ``device`` buffers, ``windowed``, ``max_seq_len`` and the
    ``_fill`` / ``_fill_decode`` / ``_upload`` / ``_metadata`` step writers)."""

    def _init_decode_graphs(self, use_graphs: bool, max_batch_size: int) -> None:
        """Graph state of a fresh runner: nothing captured until a bucket is first used."""
        self.use_graphs = use_graphs and self.backend.supports_graphs
        self.buckets = batch_buckets(max_batch_size)
        self.graphs: dict[int, tuple] = {}
        self.num_graph_replays = 0
        # batch 1 over narrower tables: width -> (host, device) tables and its (graph, holder)
        widths = narrow_widths(self.max_seq_len, self.kv.block_size) if self.use_graphs else []
        names = ["block_tables"] + (["window_block_tables"] if self.windowed else [])
        self.narrow_tables: dict[int, tuple[dict, dict]] = {}
        for width in widths:
            host = {n: np.zeros((1, width // self.kv.block_size), np.int32) for n in names}
            self.narrow_tables[width] = (host, {n: self.backend.from_host(a)
                                                for n, a in host.items()})
        self.narrow_graphs: dict[int, tuple] = {}
        self.num_narrow_replays = 0

    def _graph_width(self, sched: SchedulerOutput) -> int:
        """The narrowest table width batch 1's step fits (its keys: the context and this
        step's token), or 0: the full-width graph."""
        if len(sched.scheduled) != 1 or not self.narrow_tables:
            return 0
        keys = sched.scheduled[0].start + 1
        return next((w for w in self.narrow_tables if keys <= w), 0)

    def _narrow_skip(self, width: int) -> tuple[str, ...]:
        """The full-width tables a step on the narrow graph of ``width`` does not read (so
        not uploaded: a 40k-token server's row is 10 KB a step)."""
        return tuple(self.narrow_tables[width][0]) if width else ()

    def _narrow_upload(self, width: int, copies: list) -> None:
        """Append the narrow tables' upload (the first ``width`` tokens' blocks of row 0)."""
        host, dev = self.narrow_tables[width]
        for name, arr in host.items():
            arr[0] = self.host[name][0, :arr.shape[1]]
            copies.append((dev[name], arr))

    def _run_decode_graph(self, sched: SchedulerOutput, rows: list[LogitsRow]):
        batch = len(sched.scheduled)
        bucket = next(b for b in self.buckets if b >= batch)
        rows_of = {s.seq.seq_id: [r] for s, r in zip(sched.scheduled, rows)}
        width = self._graph_width(sched)
        self._ensure_graph(bucket)
        self._fill(sched, rows_of, bucket)
        copies: list = []
        self._upload(bucket, bucket, bucket, copies, skip=self._narrow_skip(width))
        if width:
            self._narrow_upload(width, copies)
        self.sampler.upload_params(rows, bucket, copies=copies)
        self.backend.copy_many(copies)
        return self._replay(bucket, width)[:batch]

    def _ensure_graph(self, bucket: int) -> None:
        # Captured over all-padding inputs: a backend may run the step while capturing (cuda
        # does, to size the graph's workspace), and padding rows write no KV and no recurrent
        # state, which would otherwise advance twice on that step.
        # Batch 1 captures its narrow graphs with its full one (the server's warm-up decodes
        # short prompts: every graph is ready before the first request).
        if bucket not in self.graphs:
            self._fill_decode(SchedulerOutput(), bucket)
            self._upload(bucket, bucket, bucket)
            self.sampler.upload_params([], bucket)
            self.graphs[bucket] = self._capture(bucket)
            if bucket == 1:
                for width in self.narrow_tables:
                    copies: list = []
                    self._narrow_upload(width, copies)
                    self.backend.copy_many(copies)
                    self.narrow_graphs[width] = self._capture(1, width)

    def _replay(self, bucket: int, width: int = 0):
        # Backends without real graphs hand back an EagerGraph: the same code path, run eagerly.
        graph, holder = self.narrow_graphs[width] if width else self.graphs[bucket]
        graph.replay()
        self.num_graph_replays += 1
        self.num_narrow_replays += bool(width)
        self.last_hidden = holder["hidden"]
        return holder["tokens"]

    def _capture(self, bucket: int, width: int = 0) -> tuple:
        views = {name: self.device[name][:bucket + (name == "cu_seqlens_q")] for name in self.device}
        if width:
            host, dev = self.narrow_tables[width]
            views.update(dev)
        meta = self._metadata(views, bucket, bucket, bucket, 1, width or self.max_seq_len, True)
        if width:
            meta.host = {**meta.host, "block_tables": host["block_tables"]}
        params = {name: arr[:bucket] for name, arr in self.sampler.device.items()}
        return self.capture_step(views, meta, params)

    def capture_step(self, views: dict, meta: Any, params: dict) -> tuple:
        """``(graph, holder)`` of one forward + logits + sampling step over the given device
        views, step metadata and sampler parameters; the holder gets ``hidden`` and ``tokens``.
        A CUDA graph holds raw device addresses, not the arrays: every array the captured step
        reads must outlive it, so the holder (kept as long as the graph) also keeps ``views``,
        ``meta`` (with whatever it alone references, e.g. a verify step's index arrays: freed,
        replays read reused memory, issue #27) and ``params``."""
        holder: dict = {"views": views, "meta": meta, "params": params}

        def step():
            hidden = holder["hidden"] = self.model.forward(views["input_ids"], meta)
            logits = self.model.compute_logits(hidden, views["logits_indices"])
            holder["tokens"] = self.sampler.sample(logits, params)

        return self.backend.capture(step), holder
