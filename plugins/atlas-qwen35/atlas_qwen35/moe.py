"""Sparse MoE plus a sigmoid-gated shared expert (layer ``moe_shared_expert``)."""

from __future__ import annotations

from typing import Any

from atlas_core.api import GatedMLP, ParamSpec, SparseMoE, StepMetadata


class SharedExpertMoE(SparseMoE):
    """``routed(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x)`` (Qwen2-MoE family), one
    ``moe_block`` op with the shared expert's arrays.

    Routed experts as :class:`~atlas_core.model.layers.moe.SparseMoE` (per-expert or fused
    checkpoint tensors); ``shared_expert`` is a gated MLP (``shared_expert.{gate,up,down}_proj``)
    and ``shared_expert_gate.weight`` is ``[1, hidden]``.

    Args:
        shared_expert_intermediate_size: width of the shared expert (0: none).
        fused_checkpoint: list the fused ``experts.gate_up_proj`` / ``experts.down_proj`` tensors
            first (what Qwen3.5-MoE checkpoints hold; both layouts load either way).
        **kwargs: as :class:`SparseMoE`.
    """

    def __init__(self, *, shared_expert_intermediate_size: int, fused_checkpoint: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if fused_checkpoint:
            for name in ("experts.gate_up_proj", "experts.down_proj"):
                spec = self.specs[name]
                self.specs[name] = ParamSpec(spec.shape, spec.sources[::-1], spec.dtype)
        hidden = kwargs["hidden_size"]
        self.shared_expert = None
        if shared_expert_intermediate_size > 0:
            self.shared_expert = self.add("shared_expert", GatedMLP(
                hidden_size=hidden, intermediate_size=shared_expert_intermediate_size,
                hidden_act=kwargs.get("hidden_act", "silu")))
            self.declare("shared_expert_gate.weight", (1, hidden))

    def _shared(self) -> dict[str, Any]:
        if self.shared_expert is None:
            return {}
        mlp = self.shared_expert.params
        return {"shared_gate_up": mlp["gate_up_proj.weight"], "shared_down": mlp["down_proj.weight"],
                "shared_gate": self.params["shared_expert_gate.weight"]}

    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        return self.moe_block(hidden, **self._shared()), residual

    def forward_prenorm(self, hidden: Any, residual: Any | None, norm_weight: Any, eps: float,
                        zero_centered: bool, meta: StepMetadata) -> tuple[Any, Any]:
        """The post-attention norm folded into the block (``ops.rms_norm_moe_block``)."""
        return self.moe_block_prenorm(hidden, residual, norm_weight, eps, zero_centered,
                                      **self._shared())
