"""Gated DeltaNet under speculative verification: one recurrent state per query position.

A verify step gives a sequence ``k + 1`` query tokens (its last token and ``k`` drafts). The
engine keeps the state after the last *accepted* position, so each position ``j`` writes its
own row ``meta.spec_state_rows[b][j]``, starting from the row of ``j - 1`` (position 0 from the
sequence's slot); the last position writes the slot itself. After acceptance the engine copies
the kept position's row into the slot: rejection rolls the state back without recomputing.

Each position runs the decode op (``gated_delta_rule_decode``), so the numbers are those of
plain one-token decode steps (:func:`gdn_verify_graph` is the same with device-side state
rows, for verify steps replayed from graphs); a backend could fuse the loop into one kernel writing the
per-position states (vLLM's GDN kernels do so).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.api import StepMetadata, pool_row_bytes


def gdn_verify(layer: Any, qkv: Any, z: Any, ba: Any, meta: StepMetadata) -> Any:
    """The core output ``[num_tokens, num_v_heads, head_v_dim]`` of a verify step.

    Position ``j`` of every sequence runs in one decode-op call over the sequences that have
    it (rows gathered by ``embedding``), after copying each one's state from the row of
    position ``j - 1``; the outputs, stacked position-major, are gathered back into token order.

    Args:
        layer: the :class:`~atlas_qwen35.gated_deltanet.GatedDeltaNet` (ops, params, pools).
        qkv, z, ba: the step's projected inputs, token rows packed by sequence.
        meta: the step; ``meta.spec_state_rows`` lists each sequence's state rows.
    """
    ops, be, p = layer.ops, layer.backend, layer.params
    pools = (layer.state["conv"], layer.state["ssm"])
    heads = dict(num_k_heads=layer.num_k_heads, num_v_heads=layer.num_v_heads,
                 head_k_dim=layer.head_k_dim, head_v_dim=layer.head_v_dim)
    plan = _plan(be, meta)
    width = layer.num_v_heads * layer.head_v_dim
    stacked = be.empty((meta.num_tokens, width), qkv.dtype)
    offset = 0
    for copies, rows, cu, seq_lens, dst in plan.positions:
        for src_row, dst_row in copies:
            for pool in pools:
                be.copy_(pool[dst_row:dst_row + 1], pool[src_row:src_row + 1])
        out = ops.gated_delta_rule_decode(
            ops.embedding(rows, qkv), ops.embedding(rows, z), ops.embedding(rows, ba),
            p["conv1d.weight"], p["A_log"], p["dt_bias"], p["norm.weight"], pools[0], pools[1],
            cu, seq_lens, dst, **heads, eps=layer.eps)
        n = out.shape[0]
        be.copy_(stacked[offset:offset + n], out.reshape(n, width))
        offset += n
    core = ops.embedding(plan.order, stacked)
    return core.reshape(meta.num_tokens, layer.num_v_heads, layer.head_v_dim)


def gdn_verify_graph(layer: Any, qkv: Any, z: Any, ba: Any, meta: StepMetadata) -> Any:
    """:func:`gdn_verify` for a verify step captured in a graph (``meta.spec_verify``).

    Every sequence has ``width`` rows and every position runs for every sequence, so the
    index arrays are static and the state rows come from device buffers the runner rewrites
    before each replay: position ``j`` copies rows ``src -> dst`` of both pools with one
    ``gather_blocks`` / ``scatter_blocks`` pair (inert entries copy the scratch row onto
    itself), then runs the decode op on rows ``state`` (``-1``: inert, nothing read or
    written). Work arrays are persistent (``SpecVerifyRows.buffer``): nothing is allocated
    while the graph records.
    """
    ops, be, p = layer.ops, layer.backend, layer.params
    v = meta.spec_verify
    pools = [layer.state["conv"], layer.state["ssm"]]
    heads = dict(num_k_heads=layer.num_k_heads, num_v_heads=layer.num_v_heads,
                 head_k_dim=layer.head_k_dim, head_v_dim=layer.head_v_dim)
    num_seqs = meta.num_seqs
    width = layer.num_v_heads * layer.head_v_dim
    staging = v.buffer(be, "gdn_staging", (num_seqs, sum(pool_row_bytes(pools))), np.uint8)
    stacked = v.buffer(be, "gdn_stacked", (meta.num_tokens, width), qkv.dtype)
    for j in range(v.width):
        ops.gather_blocks(pools, v.src[j], staging)
        ops.scatter_blocks(staging, v.dst[j], pools)
        rows = v.rows[j]
        out = ops.gated_delta_rule_decode(
            ops.embedding(rows, qkv), ops.embedding(rows, z), ops.embedding(rows, ba),
            p["conv1d.weight"], p["A_log"], p["dt_bias"], p["norm.weight"], pools[0], pools[1],
            v.cu_seqlens, v.seq_lens[j], v.state[j], **heads, eps=layer.eps)
        be.copy_(stacked[j * num_seqs:(j + 1) * num_seqs], out.reshape(num_seqs, width))
    core = ops.embedding(v.order, stacked)
    return core.reshape(meta.num_tokens, layer.num_v_heads, layer.head_v_dim)


class _Plan:
    """Per-position index arrays of one verify step, shared by every GDN layer of the step."""

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
    # Built once per step: every Gated DeltaNet layer of the step gets the same metadata.
    plan = meta.layer_cache.get("qwen35.gdn_verify")
    if plan is None:
        plan = meta.layer_cache["qwen35.gdn_verify"] = _Plan(be, meta)
    return plan
