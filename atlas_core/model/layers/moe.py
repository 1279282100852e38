"""Sparse mixture of experts with a softmax top-k router (layer ``moe``)."""

from __future__ import annotations

from typing import Any

from atlas_core.interfaces.layer import TransformerLayer
from atlas_core.model.layers.mlp import gated_activation
from atlas_core.interfaces.metadata import StepMetadata
from atlas_core.model.params import Module


class SparseMoE(Module, TransformerLayer):
    """Router, top-k and experts as one ``moe_block`` op (``linear`` -> ``moe_route`` ->
    ``moe_experts`` in the reference) over stacked expert weights.

    Expert weights are stacked at load: ``experts.gate_up_proj`` ``[E, 2I, H]`` (gate rows then
    up rows of each expert) and ``experts.down_proj`` ``[E, H, I]``, filled either from the
    per-expert HF tensors ``experts.{e}.{gate,up,down}_proj.weight`` or from already-fused
    tensors of those names. The router is ``gate.weight`` ``[E, H]``.

    Args:
        hidden_size: model width.
        num_experts: experts ``E``.
        num_experts_per_tok: experts chosen per token (top-k).
        moe_intermediate_size: expert width ``I``.
        norm_topk_prob: renormalise the chosen weights to sum to one.
        hidden_act: HF activation name.
        scoring: ``"softmax"`` or ``"sigmoid"`` router scores.
    """

    def __init__(self, *, hidden_size: int, num_experts: int, num_experts_per_tok: int,
                 moe_intermediate_size: int, norm_topk_prob: bool = True, hidden_act: str = "silu",
                 scoring: str = "softmax") -> None:
        super().__init__()
        if not 0 < num_experts_per_tok <= num_experts:
            raise ValueError(f"num_experts_per_tok ({num_experts_per_tok}) must be in "
                             f"1..num_experts ({num_experts})")
        self.top_k, self.renormalize, self.scoring = num_experts_per_tok, norm_topk_prob, scoring
        self.activation = gated_activation(hidden_act)
        e, h, i = num_experts, hidden_size, moe_intermediate_size
        self.declare("gate.weight", (e, h))
        per_expert = []
        for x in range(e):
            per_expert += [(f"experts.{x}.gate_proj.weight", (i, h)), (f"experts.{x}.up_proj.weight", (i, h))]
        self.declare("experts.gate_up_proj", (e, 2 * i, h),
                     [per_expert, [("experts.gate_up_proj", (e, 2 * i, h))]])
        self.declare("experts.down_proj", (e, h, i),
                     [[(f"experts.{x}.down_proj.weight", (h, i)) for x in range(e)],
                      [("experts.down_proj", (e, h, i))]])

    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        return self.moe_block(hidden), residual

    def forward_prenorm(self, hidden: Any, residual: Any | None, norm_weight: Any, eps: float,
                        zero_centered: bool, meta: StepMetadata) -> tuple[Any, Any]:
        """The DecoderLayer pre-norm protocol: the post-attention norm and residual add go into
        the block (``ops.rms_norm_moe_block``)."""
        return self.moe_block_prenorm(hidden, residual, norm_weight, eps, zero_centered)

    def moe_block_prenorm(self, hidden: Any, residual: Any | None, norm_weight: Any, eps: float,
                          zero_centered: bool, **shared: Any) -> tuple[Any, Any]:
        """``ops.rms_norm_moe_block`` over this layer's router and experts; ``(out, residual)``."""
        p = self.params
        return self.ops.rms_norm_moe_block(hidden, residual, norm_weight, eps, zero_centered,
                                           p["gate.weight"], p["experts.gate_up_proj"],
                                           p["experts.down_proj"], self.top_k, self.renormalize,
                                           self.scoring, self.activation, **shared)

    def moe_block(self, hidden: Any, **shared: Any) -> Any:
        """``ops.moe_block`` over this layer's router and experts (``shared``: the shared
        expert's ``shared_gate_up``/``shared_down``/``shared_gate`` arrays)."""
        p = self.params
        return self.ops.moe_block(hidden, p["gate.weight"], p["experts.gate_up_proj"],
                                  p["experts.down_proj"], self.top_k, self.renormalize,
                                  self.scoring, self.activation, **shared)
