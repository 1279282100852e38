"""Quantized MoE experts of the cuda backend: ``moe_experts``, ``moe_block`` and
``rms_norm_moe_block`` when an expert stack is a :class:`~atlas_core.ops.quant.QuantizedWeight`
(``kernels/cuda/common/quant_moe_mma.cu``, ``quant_moe.cu``; :class:`~atlas_cuda.ops_moe.MoeOps`
hands them here).

Decode (at most :data:`QMOE_MAX_TOKENS` tokens): one kernel computes every (token, slot) pair's
gated MLP hidden state from the chosen expert's quantized gate/up rows, a second the weighted
sum of the chosen experts' down projections; only the chosen experts' bytes are read. With
bf16 / f16 activations and both K a multiple of 128 (:func:`mma_servable`, policy
``quant_kernel`` not ``legacy``) these are the tensor-core kernels of ``quant_moe_mma.cu``
(weights the ``mma.sync`` A operand, decoded with integer ops, K split over the warps of a
block: :func:`qmoe_splits`); else the warp-per-column GEMVs of ``quant_moe.cu``. More
tokens (prefill) dequantize every expert of the layer into scratch slots first and run the bf16
MoE kernels: correct, not fast (a grouped W8A16 / W4A16 expert GEMM is the next step).
``moe_block`` runs its unfused definition, so the router, top-k and shared expert use the
table's ops (quantized shared experts included).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.api import compose_moe_block, compose_rms_norm_moe_block
from atlas_core.api import QuantizedWeight
from atlas_cuda.array import DeviceArray
from atlas_cuda.kernels_loader import variant_of
from atlas_cuda.ops_quant import ELEMS, QuantOps, fp8_scale_args, kernel_operands

#: Most tokens the quantized decode MoE kernels take.
QMOE_MAX_TOKENS = 8
#: Steps of weight loads a lane of ``qmoe2_*`` keeps in flight, by kernel (``quant_moe_mma.cu``
#: instantiates gate_up 1 / 2 and down 2 / 4). gate_up holds four weight rows a lane (gate and
#: up tiles): depth 2 is 167 registers with FP8 (one block a SM) and 128 with NVFP4 (two);
#: down holds two (depth 4: 97-128). Not yet measured against each other.
QMOE2_DEPTH = {"gate_up": 2, "down": 4}
#: Blocks a SM the K split of ``qmoe2_*`` aims the grid at (:func:`qmoe_splits`): a decode
#: step has few tiles (qwen3.5-35b-a3b batch 1: 256 gate_up warp tiles, 128 down), so the
#: warps of a block share a tile's K to put more loads in flight.
QMOE2_BLOCKS_PER_SM = 4
#: Fewest work units (128-wide K steps, times the slots for down) a warp keeps after a split.
QMOE2_MIN_UNITS = 2
#: Most slots a token of ``qmoe2_down`` takes (its block lists the slots of non-zero weight
#: with one warp ballot); larger top-k runs ``quant_moe.cu``.
QMOE2_MAX_TOP_K = 32


def moe_servable(x: Any, w_gate_up: Any, w_down: Any) -> bool:
    """Whether ``quant_moe.cu`` takes these experts: both stacks quantized in one family (FP8
    or NVFP4), each K a whole number of 16-byte chunks, aligned rows."""
    ws = (w_gate_up, w_down)
    if not all(isinstance(w, QuantizedWeight) and len(w.lead) == 1 for w in ws):
        return False
    if len({w.format == "nvfp4" for w in ws}) != 1 or x.ptr % 16:
        return False
    return all(w.data.ptr % 16 == 0 and w.shape[-1] % ELEMS.get(w.format, 16) == 0
               and (w.format != "fp8_block" or w.block_size[1] % 16 == 0) for w in ws)


def mma_servable(x: Any, w_gate_up: Any, w_down: Any) -> bool:
    """Whether ``quant_moe_mma.cu`` takes these experts: :func:`moe_servable`, bf16 / f16
    activations, hidden and intermediate sizes multiples of 128 (whole K steps; h rows then
    start on 16 bytes) and FP8 blocks a multiple of 128 wide."""
    if x.dtype.itemsize != 2 or not moe_servable(x, w_gate_up, w_down):
        return False
    return all(w.shape[-1] % 128 == 0 and (w.format != "fp8_block" or w.block_size[1] % 128 == 0)
               for w in (w_gate_up, w_down))


def qmoe_splits(tiles: int, units: int, blocks_y: int, num_sms: int) -> int:
    """Warps S (1/2/4/8) sharing one 16-row tile's ``units`` in ``qmoe2_*`` (a block: 8 / S
    tiles): doubled while the grid (``ceil(tiles S / 8) x blocks_y``) has fewer than
    :data:`QMOE2_BLOCKS_PER_SM` blocks a SM and each warp keeps :data:`QMOE2_MIN_UNITS`."""
    s = 1
    while (s < 8 and -(-tiles * s // 8) * blocks_y < QMOE2_BLOCKS_PER_SM * num_sms
           and units // (2 * s) >= QMOE2_MIN_UNITS):
        s *= 2
    return s


def _operands(w: QuantizedWeight) -> tuple[str, tuple, tuple]:
    """:func:`~atlas_cuda.ops_quant.kernel_operands` plus, for FP8, the expert stride of the
    scales (``s_lead``, 64-bit)."""
    fmt, scale, extra = kernel_operands(w)
    return fmt, scale, extra + ((np.int64(fp8_scale_args(w)[3]),) if fmt == "fp8" else ())


class QuantMoeOps:
    """The MoE ops over quantized expert stacks.

    Args:
        ctx: the backend's :class:`~atlas_cuda.context.OpContext`.
    """

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def moe_experts(self, x, w_gate_up, w_down, topk_weights, topk_ids, activation="silu"):
        """``moe_experts`` over quantized expert stacks: at most :data:`QMOE_MAX_TOKENS`
        tokens read only the chosen experts (``quant_moe_mma.cu`` where :func:`mma_servable`
        and the policy allows, else ``quant_moe.cu``); more tokens (prefill) or shapes those
        kernels cannot take dequantize every expert into scratch slots, then run
        the bf16 MoE kernels (correct, not fast). Choices of weight 0 (expert parallelism:
        other ranks' experts) are skipped on every path: no bytes read for them."""
        if activation not in ("silu", "gelu_tanh", "gelu_pytorch_tanh"):
            raise ValueError(f"moe_experts: unsupported activation {activation!r}; use silu or "
                             "gelu_tanh")
        t = x.shape[0]
        if (0 < t <= QMOE_MAX_TOKENS and self.ctx.policy.quant_kernel != "legacy"
                and topk_ids.shape[-1] <= QMOE2_MAX_TOP_K
                and mma_servable(x, w_gate_up, w_down)):
            return self._moe_decode_mma(x, w_gate_up, w_down, topk_weights, topk_ids,
                                        int(activation != "silu"))
        if 0 < t <= QMOE_MAX_TOKENS and moe_servable(x, w_gate_up, w_down):
            return self._moe_decode(x, w_gate_up, w_down, topk_weights, topk_ids,
                                    int(activation != "silu"))
        from atlas_cuda.ops_moe import MoeOps
        quant = self.ctx.bind(QuantOps)
        plain = [quant.dequantize(w, x.dtype, slot=i) if isinstance(w, QuantizedWeight) else w
                 for i, w in ((1, w_gate_up), (2, w_down))]
        return self.ctx.bind(MoeOps).moe_experts(x, *plain, topk_weights, topk_ids, activation)

    def _moe_decode(self, x, w_gate_up, w_down, weights, ids, gelu: int) -> DeviceArray:
        """``qmoe_gate_up`` then ``qmoe_down`` (one launch each)."""
        ctx = self.ctx
        t, hidden = x.shape
        inter, k = w_down.shape[-1], ids.shape[-1]
        v = variant_of(x.dtype)
        h = ctx.out((t * k, inter), np.float32)
        out = ctx.out(x.shape, x.dtype)
        fmt, sc, extra = _operands(w_gate_up)
        ctx.launch(ctx.kernels.kernel("quant_moe", v, f"qmoe_gate_up_{fmt}_{v}"),
                   (-(-inter // 8), t * k), 256, h, x, w_gate_up.data, *sc, weights, ids, k,
                   hidden, inter, gelu, *extra, pdl=ctx.pdl)
        fmt, sc, extra = _operands(w_down)
        ctx.launch(ctx.kernels.kernel("quant_moe", v, f"qmoe_down_{fmt}_{v}"),
                   (-(-hidden // 8), t), 256, out, h, w_down.data, *sc, weights, ids, k, hidden,
                   inter, *extra, pdl=ctx.pdl)
        return out

    def _moe_decode_mma(self, x, w_gate_up, w_down, weights, ids, gelu: int) -> DeviceArray:
        """``qmoe2_gate_up`` (grid: tiles of 16 gate + 16 up rows x pairs) then ``qmoe2_down``
        (tiles of 16 output rows x tokens); h between them in the activation dtype (it is the
        down kernel's MMA B operand)."""
        ctx = self.ctx
        t, hidden = x.shape
        inter, k = w_down.shape[-1], ids.shape[-1]
        v = variant_of(x.dtype)
        h = ctx.out((t * k, inter), x.dtype)
        out = ctx.out(x.shape, x.dtype)
        self._launch2("gate_up", w_gate_up, v, -(-inter // 16), hidden // 128, t * k,
                      (h, x, w_gate_up.data), (weights, ids, k, hidden, inter, gelu))
        self._launch2("down", w_down, v, -(-hidden // 16), k * (inter // 128), t,
                      (out, h, w_down.data), (weights, ids, k, hidden, inter))
        return out

    def _launch2(self, kind: str, w: QuantizedWeight, v: str, tiles: int, units: int,
                 rows: int, head: tuple, tail: tuple) -> None:
        """One ``qmoe2_{kind}`` launch over ``tiles`` 16-row tiles x ``rows`` (pairs or
        tokens), each tile's ``units`` split over S warps: operands ``head``, the scales,
        ``tail``, S, then the FP8 scale indexing."""
        ctx = self.ctx
        fmt, sc, extra = _operands(w)
        s = qmoe_splits(tiles, units, rows, ctx.num_sms)
        kern = ctx.kernels.kernel("quant_moe_mma", v,
                                  f"qmoe2_{kind}_{fmt}_{v}_d{QMOE2_DEPTH[kind]}")
        ctx.launch(kern, (-(-tiles * s // 8), rows), 256, *head, *sc, *tail, s, *extra,
                   pdl=ctx.pdl)

    def moe_block(self, x, router_weight, w_gate_up, w_down, top_k, renormalize,
                  scoring="softmax", activation="silu", shared_gate_up=None, shared_down=None,
                  shared_gate=None):
        """``moe_block`` with quantized weights: its unfused definition over the table (router
        ``linear``, ``moe_route``, the quantized ``moe_experts``, the shared expert)."""
        return compose_moe_block(self.ctx.ops, x, router_weight, w_gate_up, w_down, top_k,
                                 renormalize, scoring, activation, shared_gate_up, shared_down,
                                 shared_gate)

    def rms_norm_moe_block(self, x, residual, norm_weight, eps, zero_centered, router_weight,
                           w_gate_up, w_down, top_k, renormalize, scoring="softmax",
                           activation="silu", shared_gate_up=None, shared_down=None,
                           shared_gate=None):
        """``rms_norm`` then :meth:`moe_block`."""
        return compose_rms_norm_moe_block(self.ctx.ops, x, residual, norm_weight, eps,
                                          zero_centered, router_weight, w_gate_up, w_down,
                                          top_k, renormalize, scoring, activation,
                                          shared_gate_up, shared_down, shared_gate)
