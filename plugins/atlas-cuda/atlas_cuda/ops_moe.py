"""``moe_block`` and ``rms_norm_moe_block`` on the cuda backend: the whole MoE feed-forward of a
decode step in a few PDL kernels, else the separate ops.

Fused (at most :data:`FUSED_MAX_TOKENS` tokens, bf16/f16, per-pair GEMV routing). One token
(``kernels/cuda/common/moe_block.cu``; at most 256 experts, top-k <= 8): ``mb_router`` (router
logits, many blocks; with ``rms_norm_moe_block`` every block also normalises x + residual
itself), ``mb_gate_up`` (each block picks its token's top-k from the
logits, then act(gate) * up of its chosen or shared expert rows), ``mb_down`` (top-k again before
the PDL wait, the weighted sum of the experts' down rows). 2 to 8 tokens
(``kernels/cuda/common/moe_decode.cu``): ``moe_router`` with a last-block top-k, then the two
expert kernels. Policy ``moe_fused=0`` and larger batches run ``linear``, ``moe_route``,
``moe_experts`` and the shared-expert ops one by one.

Plain MoE blocks (no shared expert, e.g. qwen3-30b-a3b) take the fused norm + router GEMV, then
``moe_block.cu``'s expert kernels on its logits. For one token the two expert kernels are
``moe_experts1.cu``'s single persistent kernel wherever it applies.
"""

from __future__ import annotations

import numpy as np

import math
from atlas_core.api import compose_moe_block, compose_rms_norm_moe_block
from atlas_cuda.array import DeviceArray
from atlas_cuda.context import OpContext, need_vec
from atlas_cuda.kernels_loader import variant_of
from atlas_cuda.memory import require_eager
from atlas_cuda.moe_grouped import grouped_experts, use_grouped
from atlas_cuda.ops_moe_decode import FUSED_MAX_TOKENS, MoeDecodeOps
from atlas_cuda.ops_gemv import GemvOps
from atlas_cuda.ops_quant import has_quantized
from atlas_cuda.quant_moe import QuantMoeOps

#: Router rows (warps) per block of ``moe_router`` / ``mb_router``.
_ROUTER_ROWS = 4
#: Largest normed-rows shared memory of ``mb_router`` (tokens * hidden elements).
_NORM_SHMEM = 64 << 10
#: Counter slots (16 bytes each, see :meth:`MoeOps._moe_counter`) of ``moe_router`` and
#: ``moe_experts1``, one per call in turn.
_COUNTERS = 64


class MoeOps:
    """MoE routing, experts and the fused decode MoE blocks.

    Args:
        ctx: the backend's :class:`~atlas_cuda.context.OpContext`.
    """

    def __init__(self, ctx: OpContext) -> None:
        self.ctx = ctx
        self.gemv = ctx.bind(GemvOps)
        self._moe_counters: DeviceArray | None = None
        self._moe_calls = 0
        #: (device, kernel suffix, chunks, variant) -> resident moe_experts1 blocks per SM
        self._experts1_occupancy: dict[tuple, int] = {}
        #: (router ptr, shared gate ptr) -> (stacked, the two weights it copies)
        self._router_stacks: dict[tuple[int, int], tuple] = {}

    def moe_block(self, x: DeviceArray, router_weight: DeviceArray, w_gate_up: DeviceArray,
                  w_down: DeviceArray, top_k: int, renormalize: bool, scoring: str = "softmax",
                  activation: str = "silu", shared_gate_up: DeviceArray | None = None,
                  shared_down: DeviceArray | None = None,
                  shared_gate: DeviceArray | None = None) -> DeviceArray:
        if has_quantized(router_weight, w_gate_up, w_down, shared_gate_up, shared_down):
            return self.ctx.bind(QuantMoeOps).moe_block(
                x, router_weight, w_gate_up, w_down, top_k, renormalize, scoring, activation,
                shared_gate_up, shared_down, shared_gate)
        if (shared_gate_up is None) != (shared_down is None):
            raise ValueError("moe_block: give shared_gate_up and shared_down together")
        if scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"unsupported MoE scoring {scoring!r}; use softmax or sigmoid")
        if not self._moe_fusable(x, router_weight, w_gate_up, w_down, top_k, shared_gate_up,
                                 shared_down, shared_gate):
            return compose_moe_block(self.ctx.ops, x, router_weight, w_gate_up, w_down, top_k,
                                     renormalize, scoring, activation, shared_gate_up,
                                     shared_down, shared_gate)
        gelu = int(activation in ("gelu_tanh", "gelu_pytorch_tanh"))
        if self._moe_block_kernels(x, router_weight, top_k):
            return self._moe_block_fused(x, None, router_weight, w_gate_up, w_down, top_k,
                                         renormalize, scoring, gelu, shared_gate_up,
                                         shared_down, shared_gate)
        weights, ids, shared_w = self._moe_router(x, router_weight, shared_gate, top_k,
                                                  renormalize, scoring)
        return self.ctx.bind(MoeDecodeOps).experts(x, w_gate_up, w_down, weights, ids,
                                                   shared_gate_up, shared_down, shared_w, gelu)

    def _moe_fusable(self, x, router_weight, w_gate_up, w_down, top_k, shared_gate_up,
                     shared_down, shared_gate) -> bool:
        mode = self.ctx.policy.moe_fused
        if mode == "0" or (mode == "auto" and shared_gate_up is None):
            return False
        return self._moe_decode_shapes(x, router_weight, w_gate_up, w_down, top_k,
                                       shared_gate_up, shared_down, shared_gate)

    def _moe_decode_shapes(self, x, router_weight, w_gate_up, w_down, top_k, shared_gate_up,
                           shared_down, shared_gate) -> bool:
        """Whether the few-token expert kernels serve these operands."""
        t, hidden = x.shape
        experts, inter = w_down.shape[0], w_down.shape[-1]
        arrays = (x, router_weight, w_gate_up, w_down, shared_gate_up, shared_down, shared_gate)
        if not 0 < t <= FUSED_MAX_TOKENS:
            return False
        if x.dtype.itemsize != 2 or any(a is not None and a.dtype != x.dtype for a in arrays):
            return False
        if experts > 1024 or top_k > 32 or use_grouped(t * top_k, experts, x.dtype,
                                                             self.ctx.policy.moe):
            return False
        widths = (hidden, inter) + (() if shared_down is None else (shared_down.shape[-1],))
        return all(w % 8 == 0 for w in widths) and all(a is None or a.ptr % 16 == 0
                                                      for a in arrays)

    def rms_norm_moe_block(self, x: DeviceArray, residual: DeviceArray | None,
                           norm_weight: DeviceArray, eps: float, zero_centered: bool,
                           router_weight: DeviceArray, w_gate_up: DeviceArray, w_down: DeviceArray,
                           top_k: int, renormalize: bool, scoring: str = "softmax",
                           activation: str = "silu", shared_gate_up: DeviceArray | None = None,
                           shared_down: DeviceArray | None = None,
                           shared_gate: DeviceArray | None = None):
        """``moe_block(rms_norm(x, norm_weight, eps, residual), ...)`` and the new residual; see
        :func:`atlas_core.ops.moe.rms_norm_moe_block`. On the ``block`` kernels the norm runs in
        every router block; where the MoE runs as separate ops (plain MoE blocks, e.g.
        qwen3-30b-a3b) the router is a fused norm GEMV that also writes the normed rows for the
        experts; else ``rms_norm`` then ``moe_block``."""
        if has_quantized(router_weight, w_gate_up, w_down, shared_gate_up, shared_down):
            return self.ctx.bind(QuantMoeOps).rms_norm_moe_block(
                x, residual, norm_weight, eps, zero_centered, router_weight, w_gate_up, w_down,
                top_k, renormalize, scoring, activation, shared_gate_up, shared_down, shared_gate)
        moe = (router_weight, w_gate_up, w_down, top_k, renormalize, scoring, activation,
               shared_gate_up, shared_down, shared_gate)
        t, hidden = x.shape
        fusable = self._moe_fusable(x, router_weight, w_gate_up, w_down, top_k, shared_gate_up,
                                    shared_down, shared_gate)
        fold = (fusable and self._moe_block_kernels(x, router_weight, top_k)
                and scoring in ("softmax", "sigmoid")
                and t * hidden * x.dtype.itemsize <= _NORM_SHMEM
                and all(a is not None and a.dtype == x.dtype and a.ptr % 16 == 0
                        for a in (norm_weight,) + ((residual,) if residual is not None else ())))
        renorm, sig = int(renormalize), int(scoring == "sigmoid")
        gelu = int(activation in ("gelu_tanh", "gelu_pytorch_tanh"))
        routed = (w_gate_up, w_down, top_k, renorm, sig, gelu)
        if not fusable and self.gemv.norm_gemv_fusable(x, residual, norm_weight, router_weight):
            if (shared_gate_up is None
                    and router_weight.shape[0] <= 256 and top_k <= 8
                    and self._moe_decode_shapes(x, router_weight, w_gate_up, w_down, top_k,
                                                None, None, None)):
                return self._router_gemv_experts(x, residual, norm_weight, eps, zero_centered,
                                                 router_weight, None, None, *routed)
            # the pre-norm rides on the router GEMV, which also writes the normed rows
            logits, r, h = self.gemv.norm_gemv(x, residual, norm_weight, eps, router_weight,
                                               None, zero_centered, None, normed=True)
            out = compose_moe_block(self.ctx.ops, h, *moe, router_logits=logits)
            return out, (r if residual is not None else x)
        if not fold:
            return compose_rms_norm_moe_block(self.ctx.ops, x, residual, norm_weight, eps,
                                              zero_centered, *moe)
        if (shared_gate is not None and shared_gate.dtype == router_weight.dtype
                and shared_gate.size == router_weight.shape[-1]
                and self.gemv.norm_gemv_fusable(x, residual, norm_weight, router_weight)):
            return self._router_gemv_experts(x, residual, norm_weight, eps, zero_centered,
                                             self._router_stack(router_weight, shared_gate),
                                             shared_gate_up, shared_down, *routed)
        norm = (residual, norm_weight, float(eps), int(zero_centered))
        return self._moe_block_fused(x, norm, router_weight, w_gate_up, w_down, top_k,
                                     renormalize, scoring, gelu, shared_gate_up, shared_down,
                                     shared_gate)

    def _router_gemv_experts(self, x, residual, norm_weight, eps, zero_centered, router,
                             shared_gate_up, shared_down, w_gate_up, w_down, top_k, renorm, sig,
                             gelu):
        """The fused norm + router GEMV over ``router`` (its logits in the dtype of x; it also
        writes the normed rows), then the experts on those logits (:meth:`_mb_experts`, "_t").
        Returns ``(out, residual out)``."""
        logits, r, h = self.gemv.norm_gemv(x, residual, norm_weight, eps, router, None,
                                           zero_centered, None, normed=True)
        out = self._mb_experts(h, logits, router.shape[0], w_gate_up, w_down, shared_gate_up,
                               shared_down, top_k, renorm, sig, gelu, "_t")
        return out, (r if residual is not None else x)

    @staticmethod
    def _moe_block_kernels(x, router_weight, top_k) -> bool:
        """Whether the fused path runs ``moe_block.cu`` (else ``moe_decode.cu``): one token only
        (H200 qwen3.5-35b-a3b batch 1 320.8 -> 352.8 tok/s against ``moe_decode.cu``), as 2 and 8
        tokens measured slower than ``moe_decode.cu`` (35B block 50.9 -> 61.2 us)."""
        return x.shape[0] == 1 and router_weight.shape[0] <= 256 and top_k <= 8

    def _moe_block_fused(self, x, norm, router_weight, w_gate_up, w_down, top_k, renormalize,
                         scoring, gelu, shared_gate_up, shared_down, shared_gate):
        """The three ``moe_block.cu`` kernels; ``norm``: ``(residual, weight, eps, zero_centered)``
        folds the pre-norm into the router. Returns ``out`` or, with ``norm``, ``(out, residual)``."""
        t, hidden = x.shape
        experts = router_weight.shape[0]
        self._moe_calls += 1  # counts fused calls (moe_decode.cu's counters turn with it)
        rows = experts + (shared_gate is not None)
        sig, renorm = int(scoring == "sigmoid"), int(renormalize)
        launch, v = self.ctx.launch, variant_of(x.dtype)
        logits = self.ctx.out((t, rows), np.float32)
        xe, r_out, shmem, nargs = x, None, 0, (None, None, 0.0, 0)
        if norm is not None:
            xe = self.ctx.out(x.shape, x.dtype)
            r_out = self.ctx.out(x.shape, x.dtype) if norm[0] is not None else None
            shmem, nargs = t * hidden * x.dtype.itemsize, norm
        launch(self.ctx.kernels.kernel("moe_block", v, f"mb_router_{v}", _NORM_SHMEM),
               -(-rows // _ROUTER_ROWS), 32 * _ROUTER_ROWS, logits, xe, r_out, x, *nargs,
               router_weight, shared_gate, t, experts, hidden, shmem=shmem, pdl=self.ctx.pdl)
        out = self._mb_experts(xe, logits, rows, w_gate_up, w_down, shared_gate_up, shared_down,
                               top_k, renorm, sig, gelu, "")
        if norm is None:
            return out
        return out, (r_out if norm[0] is not None else x)

    def _mb_experts(self, x, logits, rows, w_gate_up, w_down, shared_gate_up, shared_down,
                    top_k, renorm, sig, gelu, suffix) -> DeviceArray:
        """The experts of a decode MoE block on its router logits ``[T, rows]`` (``suffix`` ""
        for ``mb_router``'s float logits, "_t" for a router GEMV's in the dtype of x): one token
        through :meth:`_moe_experts1` where it applies, else ``moe_block.cu``'s ``mb_gate_up`` /
        ``mb_down``, each block picking the top-k itself."""
        out = self._moe_experts1(x, logits, rows, w_gate_up, w_down, shared_gate_up, shared_down,
                                 top_k, renorm, sig, gelu, suffix)
        if out is not None:
            return out
        t, hidden = x.shape
        experts, inter, k = w_down.shape[0], w_down.shape[-1], top_k
        s_inter = 0 if shared_down is None else shared_down.shape[-1]
        launch, v = self.ctx.launch, variant_of(x.dtype)
        h = self.ctx.out((t * k, inter), np.float32)
        hs = self.ctx.out((t, s_inter), np.float32) if s_inter else None
        launch(self.ctx.kernels.kernel("moe_block", v, f"mb_gate_up{suffix}_c4_{v}"),
               (-(-max(inter, s_inter) // 8), t * k + (t if s_inter else 0)), 256, h, hs, x,
               w_gate_up, shared_gate_up, logits, t, k, experts, rows, renorm, sig, hidden, inter,
               s_inter, gelu, pdl=self.ctx.pdl)
        nc = -(-inter // 256) if t == 1 and inter <= 1024 else 0
        out = self.ctx.out(x.shape, x.dtype)
        launch(self.ctx.kernels.kernel("moe_block", v, f"mb_down{suffix}_w{nc}_{v}"),
               (-(-hidden // 8), t), 256, out, h, hs, w_down, shared_down, logits, k, experts,
               rows, renorm, sig, hidden, inter, s_inter, 1, pdl=self.ctx.pdl)
        return out

    def _moe_experts1(self, x, logits, rows, w_gate_up, w_down, shared_gate_up, shared_down,
                      top_k, renorm, sig, gelu, suffix) -> DeviceArray | None:
        """One token's routed and shared experts as ``moe_experts1.cu``'s single persistent
        kernel (top-k from the logits, gate_up, a grid-wide barrier, down; the selection
        overlapped with the first loads), or None where it does not apply (several tokens, f32,
        widths over 1,024, more than 256 experts or top-k over 8). Against ``moe_block.cu``'s
        two kernels, H200 batch 1: qwen3-30b-a3b 405 against 367.7 tok/s, qwen3.5-35b-a3b 382.9
        against 371.8; without the overlap 391.8 and 361.3."""
        t, hidden = x.shape
        experts, inter = w_down.shape[0], w_down.shape[-1]
        s_inter = 0 if shared_down is None else shared_down.shape[-1]
        nc = -(-max(inter, s_inter) // 256)
        if (t != 1 or x.dtype.itemsize != 2
                or nc > 4 or experts > 256 or top_k > 8):
            return None
        v = variant_of(x.dtype)
        kern = self.ctx.kernels.kernel("moe_experts1", v, f"moe_experts1{suffix}_w{nc}_{v}")
        key = (self.ctx.backend.device.device_id, suffix, nc, v)
        per_sm = self._experts1_occupancy.get(key)
        if per_sm is None:
            per_sm = self._experts1_occupancy[key] = \
                kern.occupancy.max_active_blocks_per_multiprocessor(256, 4 * (8 * 1024 + 1024))
        # every block must be resident at once: the kernel has a grid-wide barrier
        blocks = min(per_sm * self.ctx.num_sms, -(-hidden // 8))
        if blocks < 1:
            return None
        h = self.ctx.out((top_k, inter), np.float32)
        hs = self.ctx.out((s_inter,), np.float32) if s_inter else None
        out = self.ctx.out(x.shape, x.dtype)
        sync = self._moe_counter(barrier=True)
        self.ctx.launch(kern, blocks, 256, out, h, hs, x, w_gate_up, w_down, shared_gate_up,
                        shared_down, logits, sync, top_k, experts, rows, renorm, sig, hidden,
                        inter, s_inter, gelu, 1, shmem=4 * (top_k * inter + s_inter),
                        pdl=self.ctx.pdl)
        return out

    def _router_stack(self, router_weight: DeviceArray, shared_gate: DeviceArray) -> DeviceArray:
        """``[router_weight; shared_gate]`` ``[E + 1, H]``, one router GEMV's matrix: copied on
        the first call (never under capture) and kept with the two weights it came from."""
        stacks, be = self._router_stacks, self.ctx.backend
        key = (router_weight.ptr, shared_gate.ptr)
        hit = stacks.get(key)
        if hit is None:
            require_eager(be, "moe_block")
            experts, hidden = router_weight.shape
            stacked = be.empty((experts + 1, hidden), router_weight.dtype)
            be.copy_(DeviceArray(stacked.ptr, router_weight.shape, stacked.dtype, stacked),
                     router_weight)
            be.copy_(DeviceArray(stacked.ptr + router_weight.nbytes, (1, hidden),
                                      stacked.dtype, stacked), shared_gate)
            hit = stacks[key] = (stacked, router_weight, shared_gate)
        return hit[0]

    def _moe_counter(self, barrier: bool = False) -> DeviceArray:
        """A zeroed counter slot of 4 int32 (16 bytes), a different one for each call in turn,
        allocated once, outside graph capture: ``moe_router``'s completion counter is int32 0
        (the kernel leaves it at zero); with ``barrier``, ints 2-3 as one 64-bit count that
        only grows (``moe_experts1``'s grid barrier)."""
        if self._moe_counters is None:
            require_eager(self.ctx.backend, "moe_block")
            self._moe_counters = self.ctx.backend.zeros((4 * _COUNTERS,), np.int32)
        i = 4 * (self._moe_calls % _COUNTERS)
        self._moe_calls += 1
        return self._moe_counters[i + 2:i + 4] if barrier else self._moe_counters[i:i + 1]

    def _moe_router(self, x, router_weight, shared_gate, top_k, renormalize, scoring):
        """``(topk_weights [T, k] f32, topk_ids [T, k] i32, shared gate [T] f32 or None)``."""
        t, hidden = x.shape
        experts = router_weight.shape[0]
        rows = experts + (shared_gate is not None)
        weights, ids = self.ctx.out((t, top_k), np.float32), self.ctx.out((t, top_k), np.int32)
        shared_w = self.ctx.out((t,), np.float32) if shared_gate is not None else None
        logits = self.ctx.out((t, rows), np.float32)
        self.ctx.launch(self.ctx.kernel("moe_decode", x.dtype, "moe_router"),
                               -(-rows // _ROUTER_ROWS), 32 * _ROUTER_ROWS, weights, ids,
                               shared_w, logits, self._moe_counter(), x, router_weight,
                               shared_gate, t, experts, hidden, top_k, int(renormalize),
                               int(scoring == "sigmoid"), pdl=self.ctx.pdl)
        return weights, ids, shared_w

    def moe_route(self, router_logits: DeviceArray, top_k: int, renormalize: bool,
                  scoring: str = "softmax"):
        if scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"unsupported MoE scoring {scoring!r}; use softmax or sigmoid")
        t, e = router_logits.shape
        if e > 1024 or not 0 < top_k <= min(32, e):
            raise ValueError(f"moe_route: at most 1024 experts and top_k between 1 and "
                             f"min(32, experts) on cuda (got {e} experts, top_k {top_k})")
        w, ids = self.ctx.out((t, top_k), np.float32), self.ctx.out((t, top_k), np.int32)
        if t:
            pl = 4 if e <= 128 else 8 if e <= 256 else 32
            self.ctx.launch(self.ctx.kernel("moe", router_logits.dtype, f"moe_route_w{pl}"),
                            -(-t // 4), 128, w, ids, router_logits, t, e, top_k,
                            int(renormalize), int(scoring == "sigmoid"), pdl=self.ctx.pdl)
        return w, ids

    def moe_experts(self, x: DeviceArray, w_gate_up: DeviceArray, w_down: DeviceArray,
                    topk_weights: DeviceArray, topk_ids: DeviceArray,
                    activation: str = "silu") -> DeviceArray:
        """See :func:`atlas_core.ops.moe.moe_experts`. Choices with weight 0 are skipped on
        every path (expert parallelism marks other ranks' experts that way: weight 0, id 0):
        the per-pair GEMVs read none of their bytes, the grouped path leaves them out of the
        per-expert tiles (expert 0 gets no extra rows), the quantized kernels likewise."""
        if has_quantized(w_gate_up, w_down):
            return self.ctx.bind(QuantMoeOps).moe_experts(x, w_gate_up, w_down, topk_weights,
                                                       topk_ids, activation)
        t, hidden = x.shape
        inter, k = w_down.shape[-1], topk_ids.shape[-1]
        need_vec("moe_experts", x, w_gate_up, w_down, last=math.gcd(hidden, inter))
        gelu = int(activation in ("gelu_tanh", "gelu_pytorch_tanh"))
        if not t:
            return self.ctx.out(x.shape, x.dtype)
        if not use_grouped(t * k, w_down.shape[0], x.dtype, self.ctx.policy.moe):
            # per-pair GEMVs: moe_decode.cu's expert kernels without a shared expert
            return self.ctx.bind(MoeDecodeOps).experts(x, w_gate_up, w_down, topk_weights,
                                                       topk_ids, None, None, None, gelu)
        out = self.ctx.out(x.shape, x.dtype)
        grouped_experts(self.ctx, out, x, w_gate_up, w_down, topk_weights, topk_ids, gelu)
        return out
