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
"""

from __future__ import annotations

from typing import Any

from atlas_core.engine.sampler import LogitsRow
from atlas_core.engine.scheduler import SchedulerOutput


def batch_buckets(max_batch_size: int) -> list[int]:
    """Decode graph sizes: powers of two below ``max_batch_size``, then ``max_batch_size``."""
    sizes, b = [], 1
    while b < max_batch_size:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch_size]


class DecodeGraphsMixin:
    """Capture and replay of decode graphs for a runner (``backend``, ``model``, ``sampler``,
    ``device`` buffers, ``max_seq_len`` and the ``_fill`` / ``_fill_decode`` / ``_upload`` /
    ``_metadata`` step writers)."""

    def _init_decode_graphs(self, use_graphs: bool, max_batch_size: int) -> None:
        """Graph state of a fresh runner: nothing captured until a bucket is first used."""
        self.use_graphs = use_graphs and self.backend.supports_graphs
        self.buckets = batch_buckets(max_batch_size)
        self.graphs: dict[int, tuple] = {}
        self.num_graph_replays = 0

    def _run_decode_graph(self, sched: SchedulerOutput, rows: list[LogitsRow]):
        batch = len(sched.scheduled)
        bucket = next(b for b in self.buckets if b >= batch)
        rows_of = {s.seq.seq_id: [r] for s, r in zip(sched.scheduled, rows)}
        self._ensure_graph(bucket)
        self._fill(sched, rows_of, bucket)
        copies: list = []
        self._upload(bucket, bucket, bucket, copies)
        self.sampler.upload_params(rows, bucket, copies=copies)
        self.backend.copy_many(copies)
        return self._replay(bucket)[:batch]

    def _ensure_graph(self, bucket: int) -> None:
        # Captured over all-padding inputs: a backend may run the step while capturing (cuda
        # does, to size the graph's workspace), and padding rows write no KV and no recurrent
        # state, which would otherwise advance twice on that step.
        if bucket not in self.graphs:
            self._fill_decode(SchedulerOutput(), bucket)
            self._upload(bucket, bucket, bucket)
            self.sampler.upload_params([], bucket)
            self.graphs[bucket] = self._capture(bucket)

    def _replay(self, bucket: int):
        # Backends without real graphs hand back an EagerGraph: the same code path, run eagerly.
        graph, holder = self.graphs[bucket]
        graph.replay()
        self.num_graph_replays += 1
        self.last_hidden = holder["hidden"]
        return holder["tokens"]

    def _capture(self, bucket: int) -> tuple:
        views = {name: self.device[name][:bucket + (name == "cu_seqlens_q")] for name in self.device}
        meta = self._metadata(views, bucket, bucket, bucket, 1, self.max_seq_len, True)
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
