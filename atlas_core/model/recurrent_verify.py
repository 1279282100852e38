"""Recurrent layers under speculative verification: one state row per query position.

A verify step gives a sequence ``k + 1`` query tokens (its last token and ``k`` drafts). The
engine keeps the state after the last *accepted* position, so each position ``j`` writes its
own row ``meta.spec_state_rows[b][j]``, starting from the row of ``j - 1`` (position 0 from the
sequence's slot); the last position writes the slot itself. After acceptance the engine copies
the kept position's row into the slot: rejection rolls the state back without recomputing.

:func:`recurrent_verify` runs a layer's one-token decode op once per position over the
sequences that have it, after copying each one's state rows forward; the outputs, stacked
position-major, come back in token order. The numbers are those of plain one-token decode steps.
:func:`recurrent_verify_graph` is the same for a verify step replayed from a graph
(``meta.spec_verify``: device-side state rows). Gated DeltaNet (atlas-qwen35) and Mamba-2
(atlas-nemotron-h) both run on these; a backend could fuse the loop into one kernel writing the
per-position states (vLLM's GDN kernels do so).

The layer passes ``step(rows, cu_seqlens, seq_lens, state)``: its decode op over the step's
token rows ``rows`` (an int32 device index into the packed inputs, to gather with
``embedding``), one row a sequence (``cu_seqlens``), each sequence's length after the position
and the state rows to update in place; it returns ``[len(rows), width]`` (or any shape of that
many rows and ``width`` columns).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from atlas_core.interfaces.metadata import StepMetadata
from atlas_core.ops.block_copy import pool_row_bytes

Step = Callable[[Any, Any, Any, Any], Any]


def recurrent_verify(ops: Any, backend: Any, meta: StepMetadata, pools: list, step: Step,
                     width: int, dtype: Any) -> Any:
    """``[num_tokens, width]`` outputs of a verify step (``meta.spec_state_rows``), token order.

    Args:
        ops, backend: the layer's ops and backend.
        meta: the step.
        pools: the layer's state pools (rows indexed by state row; copied forward together).
        step: the layer's one-token decode op (see the module docstring).
        width: output columns a row.
        dtype: output dtype.
    """
    plan = _plan(backend, meta)
    stacked = backend.empty((meta.num_tokens, width), dtype)
    offset = 0
    for copies, rows, cu, seq_lens, dst in plan.positions:
        for src_row, dst_row in copies:
            for pool in pools:
                backend.copy_(pool[dst_row:dst_row + 1], pool[src_row:src_row + 1])
        out = step(rows, cu, seq_lens, dst)
        n = out.shape[0]
        backend.copy_(stacked[offset:offset + n], out.reshape(n, width))
        offset += n
    return ops.embedding(plan.order, stacked)


def recurrent_verify_graph(ops: Any, backend: Any, meta: StepMetadata, pools: list, step: Step,
                           width: int, dtype: Any, tag: str) -> Any:
    """:func:`recurrent_verify` for a verify step captured in a graph (``meta.spec_verify``).

    Every sequence has ``width`` rows and every position runs for every sequence, so the
    index arrays are static and the state rows come from device buffers the runner rewrites
    before each replay: position ``j`` copies rows ``src -> dst`` of every pool with one
    ``gather_blocks`` / ``scatter_blocks`` pair (inert entries copy the scratch row onto
    itself), then runs ``step`` on rows ``state`` (``-1``: inert, nothing read or written).
    Work arrays are persistent (``SpecVerifyRows.buffer`` under ``tag``, the layer kind's):
    nothing is allocated while the graph records.
    """
    v = meta.spec_verify
    num_seqs = meta.num_seqs
    staging = v.buffer(backend, f"{tag}_staging", (num_seqs, sum(pool_row_bytes(pools))),
                       np.uint8)
    stacked = v.buffer(backend, f"{tag}_stacked", (meta.num_tokens, width), dtype)
    for j in range(v.width):
        ops.gather_blocks(pools, v.src[j], staging)
        ops.scatter_blocks(staging, v.dst[j], pools)
        out = step(v.rows[j], v.cu_seqlens, v.seq_lens[j], v.state[j])
        backend.copy_(stacked[j * num_seqs:(j + 1) * num_seqs], out.reshape(num_seqs, width))
    return ops.embedding(v.order, stacked)


class _Plan:
    """Per-position index arrays of one verify step, shared by every recurrent layer of it."""

    def __init__(self, be: Any, meta: StepMetadata) -> None:
        cu, lens = meta.host["cu_seqlens_q"], meta.host["seq_lens"]
        slots = meta.host["state_indices"]
        counts = [int(cu[b + 1] - cu[b]) for b in range(meta.num_seqs)]
        order = np.zeros(meta.num_tokens, np.int32)
        self.positions, offset = [], 0
        for j in range(max(counts)):
            members = [b for b, q in enumerate(counts) if q > j]
            rows = [int(cu[b]) + j for b in members]
            dst = [meta.spec_state_rows[b][j] for b in members]
            src = [int(slots[b]) if j == 0 else meta.spec_state_rows[b][j - 1] for b in members]
            order[rows] = np.arange(offset, offset + len(rows))
            offset += len(rows)
            self.positions.append((
                [(s, d) for s, d in zip(src, dst) if s != d],
                be.from_host(np.asarray(rows, np.int32)),
                be.from_host(np.arange(len(rows) + 1, dtype=np.int32)),
                be.from_host(np.asarray([int(lens[b]) - counts[b] + j + 1 for b in members],
                                        np.int32)),
                be.from_host(np.asarray(dst, np.int32))))
        self.order = be.from_host(order)


def _plan(be: Any, meta: StepMetadata) -> _Plan:
    # Built once per step: every recurrent layer of the step gets the same metadata.
    plan = meta.layer_cache.get("recurrent_verify")
    if plan is None:
        plan = meta.layer_cache["recurrent_verify"] = _Plan(be, meta)
    return plan
