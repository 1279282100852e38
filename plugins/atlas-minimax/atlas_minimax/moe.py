"""MiniMax-M2 sparse MoE: sigmoid router with a routing-only correction bias (layer
``minimax_m2_moe``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.api import Module, StepMetadata, TransformerLayer, gated_activation


class MiniMaxM2SparseMoE(Module, TransformerLayer):
    """``linear`` (router ``gate``) -> ``moe_route_biased`` (sigmoid scores; the choice adds
    ``e_score_correction_bias``; chosen weights renormalised) -> ``moe_experts``.

    Parameter names mirror the released checkpoints (``block_sparse_moe.*``): per-expert
    ``experts.{e}.w1`` (gate), ``w3`` (up) and ``w2`` (down) are stacked at load into
    ``experts.gate_up_proj`` ``[E, 2I, H]`` and ``experts.down_proj`` ``[E, H, I]`` (already
    stacked tensors of those names are taken too). The bias is kept in float32.

    Args:
        hidden_size: model width ``H``.
        num_experts: experts ``E``.
        num_experts_per_tok: experts chosen per token.
        intermediate_size: expert width ``I`` (HF reads the config's ``intermediate_size``).
        hidden_act: HF activation name.
        norm_topk_prob: renormalise the chosen weights (HF always does).
    """

    def __init__(self, *, hidden_size: int, num_experts: int, num_experts_per_tok: int,
                 intermediate_size: int, hidden_act: str = "silu",
                 norm_topk_prob: bool = True) -> None:
        super().__init__()
        if not 0 < num_experts_per_tok <= num_experts:
            raise ValueError(f"num_experts_per_tok ({num_experts_per_tok}) must be in "
                             f"1..num_local_experts ({num_experts})")
        self.top_k, self.renormalize = num_experts_per_tok, norm_topk_prob
        self.activation = gated_activation(hidden_act)
        e, h, i = num_experts, hidden_size, intermediate_size
        self.declare("gate.weight", (e, h))
        self.declare("e_score_correction_bias", (e,), dtype=np.float32)
        gate_up = []
        for x in range(e):
            gate_up += [(f"experts.{x}.w1.weight", (i, h)), (f"experts.{x}.w3.weight", (i, h))]
        self.declare("experts.gate_up_proj", (e, 2 * i, h),
                     [gate_up, [("experts.gate_up_proj", (e, 2 * i, h))]])
        self.declare("experts.down_proj", (e, h, i),
                     [[(f"experts.{x}.w2.weight", (h, i)) for x in range(e)],
                      [("experts.down_proj", (e, h, i))]])

    def setup(self) -> None:
        if "moe_route_biased" not in self.ops:
            raise RuntimeError(
                "MiniMax-M2 needs the op 'moe_route_biased' (sigmoid routing with a correction "
                f"bias), which this {type(self.backend).__name__} has no implementation of; "
                "on cuda install atlas-minimax[cuda], or run on the numpy backend")

    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        p = self.params
        logits = self.ops.linear(hidden, p["gate.weight"])
        weights, ids = self.ops.moe_route_biased(logits, p["e_score_correction_bias"],
                                                 self.top_k, self.renormalize)
        out = self.ops.moe_experts(hidden, p["experts.gate_up_proj"], p["experts.down_proj"],
                                   weights, ids, self.activation)
        return out, residual
