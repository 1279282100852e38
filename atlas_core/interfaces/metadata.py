"""StepMetadata: the per-step batch layout the model runner hands to every layer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class StepMetadata:
    """Layout of one forward step over a mixed batch (prefill chunks and decode rows).

    Tokens are packed by sequence: sequence ``b`` owns token rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b+1]``. Device arrays are backend arrays already uploaded;
    ``host`` keeps the NumPy originals for backends or layers that need host-side values.

    Attributes:
        num_tokens: rows in this step.
        num_seqs: sequences in this step.
        positions: ``[num_tokens]`` int32 absolute position of each token.
        slot_mapping: ``[num_tokens]`` int32 KV-cache slot of each token (``-1``: don't write).
        cu_seqlens_q: ``[num_seqs + 1]`` int32 query-row prefix sums.
        seq_lens: ``[num_seqs]`` int32 context length after this step (cached + new tokens).
        block_tables: ``[num_seqs, max_blocks_per_seq]`` int32 KV block ids.
        logits_indices: ``[num_outputs]`` int32 rows whose logits are computed (the last row of
            every sequence that samples this step).
        state_indices: ``[num_seqs]`` int32 recurrent-state slot of each sequence (hybrid models).
        max_seqlen_q: longest query run in the batch.
        max_seq_len: longest context in the batch.
        block_size: tokens per KV block.
        is_decode: every sequence has exactly one query row.
        host: host (NumPy) copies of the arrays above, by field name.
        window_block_tables: ``[num_seqs, max_blocks_per_seq]`` int32 block ids of the
            sliding-window layers' own pool (:class:`SlidingWindowCacheSpec`), entries before a
            sequence's window unset; ``None`` when those layers share ``block_tables``.
        window_slot_mapping: ``[num_tokens]`` int32 slots of that pool, or ``None``.
        spec_state_rows: speculative verification on hybrid models, else ``None``: per
            sequence, the recurrent-state row each of its query positions writes (position
            ``j`` starts from the row of ``j - 1``, position 0 from ``state_indices[b]``), so
            the engine keeps the state after the last accepted position.
        spec_verify: a speculative verify step replayed from a graph, else ``None``: every
            sequence has exactly ``width`` query rows (padded), and the per-position state
            rows live in device buffers (:class:`SpecVerifyRows`) instead of host lists.
        multimodal: ``None``, or for a step feeding image placeholder tokens, one
            ``(first row, first token, token count, payload)`` per prefill chunk of a sequence
            carrying images (``Sequence.mm``: a model family's multimodal payload, read by
            that family's model; ``positions`` already holds its 1D positions).
        layer_cache: values one layer of a step computes from this metadata and the step's
            other layers of the same kind reuse (keyed by the layer kind's own name; a plugin's
            per-step plan), so they live exactly as long as the step's metadata.
    """

    num_tokens: int
    num_seqs: int
    positions: Any
    slot_mapping: Any
    cu_seqlens_q: Any
    seq_lens: Any
    block_tables: Any
    logits_indices: Any
    state_indices: Any = None
    max_seqlen_q: int = 1
    max_seq_len: int = 1
    block_size: int = 16
    is_decode: bool = False
    host: dict[str, np.ndarray] = field(default_factory=dict)
    spec_state_rows: list[list[int]] | None = None
    spec_verify: "SpecVerifyRows | None" = None
    multimodal: list[tuple[int, int, int, Any]] | None = None
    window_block_tables: Any = None
    window_slot_mapping: Any = None
    layer_cache: dict[str, Any] = field(default_factory=dict)


@dataclass
class SpecVerifyRows:
    """Device layout of a verify step captured in a graph (``width`` rows per sequence).

    Everything a recurrent layer needs per query position ``j`` is a device array the runner
    rewrites before each replay, so the captured work never reads host values. Inert entries
    (padding rows of a sequence with fewer drafts, padding sequences) copy the scratch row onto
    itself and run the recurrence with state index ``-1``.

    Attributes:
        width: query rows per sequence (``K + 1``).
        rows: per position, ``[num_seqs]`` int32 token rows ``b * width + j`` (static).
        src, dst: per position, ``[num_seqs]`` int32 state rows copied ``src -> dst`` before
            the position runs (``src`` of position 0: the sequence's slot).
        state: per position, ``[num_seqs]`` int32 state row the position updates (``dst``;
            ``-1`` inert).
        seq_lens: per position, ``[num_seqs]`` int32 context length after the position.
        cu_seqlens: ``[num_seqs + 1]`` int32 ``0, 1, ..., num_seqs`` (one row per position).
        order: ``[num_seqs * width]`` int32, token row ``b * width + j`` -> ``j * num_seqs + b``
            (outputs stacked position-major back into token order).
        scratch: persistent work arrays by key, allocated on first use outside any capture
            (``buffer``), shared by the layers of the step.
    """

    width: int
    rows: list
    src: list
    dst: list
    state: list
    seq_lens: list
    cu_seqlens: Any
    order: Any
    scratch: dict = field(default_factory=dict)

    def buffer(self, backend: Any, key: str, shape: tuple, dtype: Any) -> Any:
        """A persistent ``backend.empty(shape, dtype)`` kept under ``key`` (one per shape)."""
        full = (key, tuple(shape), np.dtype(dtype).str)
        arr = self.scratch.get(full)
        if arr is None:
            arr = self.scratch[full] = backend.empty(tuple(shape), dtype)
        return arr
