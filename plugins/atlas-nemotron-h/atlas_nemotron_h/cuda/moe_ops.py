"""Nemotron-H MoE ops on the cuda backend (``cuda/kernels/nemotron_moe.cu``): the grouped
sigmoid router and the non-gated experts, registered by :mod:`atlas_nemotron_h.plugin`.

The router is one kernel where it applies (``auto``): a GEMV block per expert computes the
logits of several tokens, and the last block of each token group to finish (the backend's shared
completion counters, ``ctx.sync_counters()``) selects with a one-warp-per-token grouped top-k.
Elsewhere (``ATLAS_NEMOTRON_ROUTE=two``, n_group > 1, more than 512 experts or tokens) those are
two kernels; one block doing both was latency bound (a third of a millisecond per layer at
decode). H200 nemotron-3-nano-30b-a3b at 1k, one kernel against two: 2.60 / 2.66 ms at batch 1,
9.48 / 9.49 at batch 8 (session 22); 2.62 / 2.66 and 9.43 / 9.44 (session 24, another call).

Decode batches (fewer than :data:`GROUPED_MIN_TOKENS` tokens) run the experts as two GEMV
kernels over each token's chosen experts and the shared expert if passed: up + squared ReLU
into float32 buffers (a warp per row), then down split over K (a block per piece of a token's
h -- an expert slot or part of the shared expert -- and 8 output rows, h staged in shared
memory; the last block of each rows-tile sums the pieces' partials in a fixed order): no host
sync, so decode steps capture into CUDA graphs. Prefill chunks group their rows by expert on the
host (one sync) and run each used expert as cuBLAS GEMMs over its gathered rows (``embedding``,
``linear``, ``relu2``, ``linear``; the squared ReLU rounded to the activation dtype there, as
HF rounds it), then one kernel sums every token's weighted expert rows (the shared expert, if
passed, added by the same ops).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

#: Warps per block (NM_WARPS), tokens per router-logit block (NM_TOK) and the limits of
#: nemotron_moe.cu.
WARPS, ROUTER_TOKENS, MAX_EXPERTS, MAX_GROUPS = 4, 8, 1024, 64
#: Output rows per down block (NM_DOWN_TILE) and the most K per block (NM_DOWN_PIECE).
DOWN_TILE, DOWN_PIECE = 8, 2048
#: Tokens from which the experts run as per-expert GEMMs (above any captured decode batch).
GROUPED_MIN_TOKENS = 512
#: Environment variable choosing the router: ``fused`` (one kernel whose last block of each
#: token group selects; n_group 1, at most :data:`ROUTE1_MAX_EXPERTS` experts and
#: :data:`ROUTE1_MAX_TOKENS` tokens, else the two), ``auto`` (default: the same as ``fused``) or
#: ``two`` (logits, then the selection).
ROUTE_KERNEL_ENV = "ATLAS_NEMOTRON_ROUTE"
#: NM_ROUTE1_MAX_E of the kernel, and its counters' token groups x ROUTER_TOKENS.
ROUTE1_MAX_EXPERTS, ROUTE1_GROUPS = 512, 64
ROUTE1_MAX_TOKENS = ROUTE1_GROUPS * ROUTER_TOKENS


def route_kernel() -> str:
    """The router :data:`ROUTE_KERNEL_ENV` selects (read per call)."""
    kind = os.environ.get(ROUTE_KERNEL_ENV, "auto")
    if kind not in ("auto", "two", "fused"):
        raise ValueError(f"{ROUTE_KERNEL_ENV}={kind!r}: use 'auto', 'two' or 'fused'")
    return kind


class NemotronMoeCudaOps:
    """The Nemotron-H family's MoE CUDA ops.

    Args:
        ctx: the cuda backend's op context (:class:`atlas_cuda.context.OpContext`).
    """

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def nemotron_h_moe_route(self, x: Any, router_weight: Any, correction_bias: Any, top_k: int,
                             n_group: int = 1, topk_group: int = 1, renormalize: bool = True,
                             routed_scaling_factor: float = 1.0) -> tuple[Any, Any]:
        """See :func:`atlas_nemotron_h.ffn_reference.nemotron_h_moe_route`."""
        t, hidden = x.shape
        e = router_weight.shape[0]
        if e > MAX_EXPERTS or n_group > MAX_GROUPS or e % n_group or not 0 < top_k <= e:
            raise ValueError(f"nemotron_h_moe_route: at most {MAX_EXPERTS} experts in at most "
                             f"{MAX_GROUPS} equal groups, 1 <= top_k <= experts on cuda (got "
                             f"{e} experts, {n_group} groups, top_k {top_k})")
        weights = self.ctx.out((t, top_k), np.float32)
        ids = self.ctx.out((t, top_k), np.int32)
        if t:
            ctx = self.ctx
            w, bias = ctx.f32(router_weight), ctx.f32(correction_bias)
            logits = ctx.out((t, e), np.float32)
            if (route_kernel() != "two" and n_group == 1 and e <= ROUTE1_MAX_EXPERTS
                    and t <= ROUTE1_MAX_TOKENS):
                ctx.launch(ctx.kernel("nemotron_moe", x.dtype, "nemotron_h_moe_route1"),
                           (e, -(-t // ROUTER_TOKENS)), 32 * WARPS, weights, ids, logits,
                           ctx.sync_counters(), x, w, bias, t, hidden, e, top_k, int(renormalize),
                           float(routed_scaling_factor), pdl=ctx.pdl)
                return weights, ids
            ctx.launch(ctx.kernel("nemotron_moe", x.dtype, "nemotron_h_moe_logits"),
                       (e, -(-t // ROUTER_TOKENS)), 32 * WARPS, logits, x, w, t, hidden, e,
                       pdl=ctx.pdl)
            ctx.launch(ctx.kernel("nemotron_moe", x.dtype, "nemotron_h_moe_select"), t, 32,
                       weights, ids, logits, bias, e, top_k, n_group, topk_group,
                       int(renormalize), float(routed_scaling_factor), pdl=ctx.pdl)
        return weights, ids

    def nemotron_h_moe_experts(self, x: Any, w_up: Any, w_down: Any, topk_weights: Any,
                               topk_ids: Any, shared_up: Any = None,
                               shared_down: Any = None) -> Any:
        """See :func:`atlas_nemotron_h.ffn_reference.nemotron_h_moe_experts`. Expert stacks kept
        quantized (FP8 / NVFP4 checkpoints with ``ATLAS_CUDA_QUANT_WEIGHTS=1``, or ones that fit
        the device only quantized) are dequantized into the backend's reused buffers each call
        first: correct, with all of a layer's experts written and read again (no quantized
        kernel for these non-gated experts yet)."""
        from atlas_core.api import QuantizedWeight
        stacks = (w_up, w_down, shared_up, shared_down)
        if any(isinstance(w, QuantizedWeight) for w in stacks):
            from atlas_cuda.ops_quant import QuantOps
            quant = self.ctx.bind(QuantOps)
            w_up, w_down, shared_up, shared_down = (
                quant.dequantize(w, x.dtype, slot=1 + i) if isinstance(w, QuantizedWeight) else w
                for i, w in enumerate(stacks))
        t, width = x.shape
        inter, top_k = w_up.shape[1], topk_ids.shape[1]
        shared = [w for w in (shared_up, shared_down) if w is not None]
        if len(shared) == 1:
            raise ValueError("nemotron_h_moe_experts: pass both shared_up and shared_down, "
                             "or neither")
        dtypes = [str(w.dtype) for w in (w_up, w_down, *shared)]
        if any(d != str(x.dtype) for d in dtypes):
            raise TypeError(f"nemotron_h_moe_experts: expert weights must be in {x.dtype} on "
                            f"cuda (got {', '.join(dtypes)})")
        if t >= GROUPED_MIN_TOKENS and not self.ctx.backend.capturing:
            out = self._grouped(x, w_up, w_down, topk_weights, topk_ids)
            if shared:
                ops = self.ctx.ops
                out = ops.add(out, ops.linear(ops.relu2(ops.linear(x, shared_up)), shared_down))
            return out
        out = self.ctx.out((t, width), x.dtype)
        if t:
            ctx = self.ctx
            s_inter = shared_up.shape[0] if shared else 0
            h = ctx.out((t * top_k, inter), np.float32)
            hs = ctx.out((t, s_inter), np.float32) if shared else h
            ws_up, ws_down = (shared_up, shared_down) if shared else (w_up, w_down)
            rows = t * (top_k * inter + s_inter)
            piece = min(inter, DOWN_PIECE)
            pieces = top_k * -(-inter // piece) + -(-s_inter // piece)
            tiles = -(-width // DOWN_TILE)
            part = ctx.out((t, pieces, width), np.float32)
            cnt = ctx.out((t, tiles), np.int32)
            ctx.launch(ctx.kernel("nemotron_moe", x.dtype, "nemotron_h_moe_up"),
                       -(-rows // WARPS), 32 * WARPS, h, hs, cnt, x, w_up, ws_up, topk_ids, t,
                       width, inter, s_inter, top_k, t * tiles, pdl=ctx.pdl)
            ctx.launch(ctx.kernel("nemotron_moe", x.dtype, "nemotron_h_moe_down"),
                       (tiles, pieces, t), 32 * WARPS, out, part, cnt, h, w_down,
                       topk_weights, topk_ids, hs, ws_down, width, inter, s_inter, top_k, piece,
                       pdl=ctx.pdl)
        return out

    def _grouped(self, x: Any, w_up: Any, w_down: Any, topk_weights: Any, topk_ids: Any) -> Any:
        """The experts as GEMMs over each expert's rows (prefill chunks)."""
        ctx, ops, backend = self.ctx, self.ctx.ops, self.ctx.backend
        (t, width), (num_experts, inter, _), top_k = x.shape, w_up.shape, topk_ids.shape[1]
        flat = backend.to_host(topk_ids).reshape(-1)
        order = np.argsort(flat, kind="stable")
        slots = np.empty(t * top_k, np.int32)
        slots[order] = np.arange(t * top_k, dtype=np.int32)
        tokens, pos = ctx.out((t * top_k,), np.int32), ctx.out((t, top_k), np.int32)
        backend.copy_from_host(tokens, (order // top_k).astype(np.int32))
        backend.copy_from_host(pos, slots.reshape(t, top_k))
        rows = ctx.out((t * top_k, width), x.dtype)
        experts, starts = np.unique(flat[order], return_index=True)
        for e, a, b in zip(experts.tolist(), starts.tolist(), [*starts[1:].tolist(), t * top_k]):
            up = w_up[e:e + 1].reshape(inter, width)
            down = w_down[e:e + 1].reshape(width, inter)
            h = ops.relu2(ops.linear(ops.embedding(tokens[a:b], x), up))
            backend.copy_(rows[a:b], ops.linear(h, down))
        out = ctx.out((t, width), x.dtype)
        ctx.launch(ctx.kernel("nemotron_moe", x.dtype, "nemotron_h_moe_combine"),
                   (-(-width // 256), t), 256, out, rows, topk_weights, pos, width, top_k)
        return out
