"""DeepSeek-style MoE (layer ``deepseek_moe``): group-limited routing plus shared experts."""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.api import GatedMLP, SparseMoE, StepMetadata, TransformerLayer

from atlas_deepseek.routing import SCORING


class DeepseekMoE(SparseMoE):
    """``linear`` (router ``gate``) -> ``moe_route_grouped`` -> ``moe_experts``, plus the
    always-on ``shared_experts`` gated MLP (HF ``DeepseekV3MoE`` / ``Mistral4MoE``).

    Routed experts load from per-expert ``experts.{e}.{gate,up,down}_proj.weight`` tensors
    (released checkpoints) or the stacked ``experts.gate_up_proj`` / ``experts.down_proj``
    (what transformers 5 saves), as :class:`~atlas_core.api.SparseMoE`. The routing correction
    bias ``gate.e_score_correction_bias`` is kept in float32.

    Args:
        hidden_size, num_experts, num_experts_per_tok, moe_intermediate_size, hidden_act: as
            :class:`~atlas_core.api.SparseMoE`.
        num_shared_experts: ``n_shared_experts``; the shared MLP is that many experts wide.
        num_groups, topk_groups: ``n_group`` / ``topk_group`` of the group-limited top-k.
        scoring: ``"sigmoid"`` (DeepSeek-V3) or ``"softmax"`` (Mistral-4).
        correction_bias: the router has ``e_score_correction_bias`` (DeepSeek-V3).
        norm_topk_prob: renormalise the chosen weights.
        routed_scaling_factor: multiplies the routed experts' weights.
    """

    def __init__(self, *, hidden_size: int, num_experts: int, num_experts_per_tok: int,
                 moe_intermediate_size: int, num_shared_experts: int, num_groups: int = 1,
                 topk_groups: int = 1, scoring: str = "sigmoid", correction_bias: bool = True,
                 norm_topk_prob: bool = True, routed_scaling_factor: float = 1.0,
                 hidden_act: str = "silu") -> None:
        super().__init__(hidden_size=hidden_size, num_experts=num_experts,
                         num_experts_per_tok=num_experts_per_tok,
                         moe_intermediate_size=moe_intermediate_size,
                         norm_topk_prob=norm_topk_prob, hidden_act=hidden_act, scoring=scoring)
        if scoring not in SCORING:
            raise ValueError(f"scoring_func {scoring!r} is not supported; use one of {SCORING}")
        if num_groups < 1 or num_experts % num_groups:
            raise ValueError(f"n_group ({num_groups}) must divide n_routed_experts ({num_experts})")
        if not 1 <= topk_groups <= num_groups:
            raise ValueError(f"topk_group ({topk_groups}) must be in 1..n_group ({num_groups})")
        if num_experts_per_tok > topk_groups * (num_experts // num_groups):
            raise ValueError(f"num_experts_per_tok ({num_experts_per_tok}) exceeds the experts of "
                             f"topk_group ({topk_groups}) groups of {num_experts // num_groups}")
        if num_groups > 1 and num_experts // num_groups < 2:
            raise ValueError("n_group must leave at least 2 experts per group (groups are "
                             "scored by their two best experts)")
        self.num_groups, self.topk_groups = num_groups, topk_groups
        self.routed_scaling_factor = float(routed_scaling_factor)
        self.has_bias = correction_bias
        if correction_bias:
            self.declare("gate.e_score_correction_bias", (num_experts,), dtype=np.float32)
        self.shared_experts = None
        if num_shared_experts:
            self.shared_experts = self.add("shared_experts", GatedMLP(
                hidden_size=hidden_size,
                intermediate_size=moe_intermediate_size * num_shared_experts,
                hidden_act=hidden_act))

    def setup(self) -> None:
        if "moe_route_grouped" not in self.ops:
            raise RuntimeError(
                "DeepSeek-style MoE needs the op 'moe_route_grouped', which this "
                f"{type(self.backend).__name__} has no implementation of; on cuda install "
                "atlas-deepseek[cuda], or run on the numpy backend")

    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        ops, p = self.ops, self.params
        logits = ops.linear(hidden, p["gate.weight"])
        weights, ids = ops.moe_route_grouped(
            logits, self.param("gate.e_score_correction_bias"), self.top_k, self.num_groups,
            self.topk_groups, self.scoring, self.renormalize, self.routed_scaling_factor)
        out = ops.moe_experts(hidden, p["experts.gate_up_proj"], p["experts.down_proj"], weights,
                              ids, self.activation)
        if self.shared_experts is None:
            return out, residual
        shared, _ = self.shared_experts.forward(hidden, None, meta)
        return ops.add(out, shared), residual

    forward_prenorm = TransformerLayer.forward_prenorm
