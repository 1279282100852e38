"""The Gemma-4 block (layer ``gemma4_decoder``) and the routed experts of its MoE variant."""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.api import Module, StepMetadata, TransformerLayer, gated_activation


class Gemma4Experts:
    """The routed-expert side of a 26B-A4B block (``router.*`` and ``experts.*`` of the block).

    Router: ``rms_norm(h) * router.scale * hidden_size ** -0.5`` -> ``router.proj`` -> softmax
    over all experts -> top-k -> renormalised -> times ``router.per_expert_scale`` of each chosen
    expert. Experts: stacked ``experts.gate_up_proj`` ``[E, 2I, H]`` (gate rows, then up rows)
    and ``experts.down_proj`` ``[E, H, I]``, GeGLU.

    Args:
        hidden_size: model width ``H``.
        num_experts, top_k, moe_intermediate_size: ``E``, experts per token, ``I``.
        hidden_act: HF activation name.
    """

    def __init__(self, *, hidden_size: int, num_experts: int, top_k: int,
                 moe_intermediate_size: int, hidden_act: str) -> None:
        if not 0 < top_k <= num_experts:
            raise ValueError(f"top_k_experts ({top_k}) must be in 1..num_experts ({num_experts})")
        self.hidden_size, self.num_experts, self.top_k = hidden_size, num_experts, top_k
        self.intermediate_size = moe_intermediate_size
        self.activation = gated_activation(hidden_act)

    def declare(self, block: Module) -> None:
        """Declare the router and expert parameters on ``block``."""
        e, h, i = self.num_experts, self.hidden_size, self.intermediate_size
        block.declare("router.proj.weight", (e, h))
        block.declare("router.scale", (h,))
        block.declare("router.per_expert_scale", (e,))
        block.declare("experts.gate_up_proj", (e, 2 * i, h))
        block.declare("experts.down_proj", (e, h, i))

    def __call__(self, ops: Any, params: dict[str, Any], hidden: Any, experts_in: Any,
                 root_size: Any, eps: float) -> Any:
        """Route on ``hidden`` (the residual stream), run the experts on ``experts_in``."""
        routed = ops.mul(ops.rms_norm(hidden, params["router.scale"], eps), root_size)
        logits = ops.linear(routed, params["router.proj.weight"])
        weights, ids = ops.moe_route(logits, self.top_k, True)
        # weights, ids: [num_tokens, top_k]
        scales = ops.embedding(ids.reshape(-1), params["router.per_expert_scale"].reshape(-1, 1))
        weights = ops.mul(weights, scales.reshape(weights.shape))
        return ops.moe_experts(experts_in, params["experts.gate_up_proj"],
                               params["experts.down_proj"], weights, ids, self.activation)


class Gemma4DecoderLayer(Module, TransformerLayer):
    """``h += post_attention_layernorm(attn(input_layernorm(h)))``, then
    ``h += post_feedforward_layernorm(ffn)`` and ``h *= layer_scalar``.

    ``ffn`` is ``mlp(pre_feedforward_layernorm(h))``; with a MoE it is
    ``post_feedforward_layernorm_1(that) + post_feedforward_layernorm_2(moe(h))`` where the experts
    take ``pre_feedforward_layernorm_2(h)``. Norms are plain RMSNorms (weight stored as is).
    The block returns the whole residual stream (no residual carried to the next block).

    Args:
        attention: the ``gemma4_attention`` layer.
        mlp: the dense ``mlp`` (GeGLU).
        experts: the routed experts (:class:`Gemma4Experts`) of a MoE block, or None.
        hidden_size: model width.
        rms_norm_eps: norm epsilon.
    """

    def __init__(self, attention: TransformerLayer, mlp: TransformerLayer,
                 experts: Gemma4Experts | None = None, *, hidden_size: int,
                 rms_norm_eps: float) -> None:
        super().__init__()
        self.attention, self.mlp, self.moe, self.eps = attention, mlp, experts, rms_norm_eps
        self.hidden_size = hidden_size
        self.add("self_attn", attention)
        self.add("mlp", mlp)
        self.root_size: Any = None
        norms = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"]
        if experts is not None:
            experts.declare(self)
            norms += ["pre_feedforward_layernorm_2", "post_feedforward_layernorm_1",
                      "post_feedforward_layernorm_2"]
        for name in norms:
            self.declare(f"{name}.weight", (hidden_size,))
        self.declare("layer_scalar", (1,))

    def setup(self) -> None:
        if self.moe is not None:
            self.root_size = self.backend.from_host(
                np.array([self.hidden_size ** -0.5], dtype=self.dtype))

    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        ops, p, eps = self.ops, self.params, self.eps
        if residual is not None:
            hidden = ops.add(hidden, residual)
        attn, _ = self.attention.forward(ops.rms_norm(hidden, p["input_layernorm.weight"], eps),
                                         None, meta)
        attn = ops.rms_norm(attn, p["post_attention_layernorm.weight"], eps)
        x, hidden = ops.rms_norm(attn, p["pre_feedforward_layernorm.weight"], eps, hidden)
        ffn, _ = self.mlp.forward(x, None, meta)
        if self.moe is not None:
            ffn = ops.rms_norm(ffn, p["post_feedforward_layernorm_1.weight"], eps)
            experts_in = ops.rms_norm(hidden, p["pre_feedforward_layernorm_2.weight"], eps)
            routed = self.moe(ops, p, hidden, experts_in, self.root_size, eps)
            ffn = ops.add(ffn, ops.rms_norm(routed, p["post_feedforward_layernorm_2.weight"], eps))
        ffn = ops.rms_norm(ffn, p["post_feedforward_layernorm.weight"], eps)
        return ops.mul(ops.add(hidden, ffn), p["layer_scalar"]), None

    def state_spec(self) -> Any:
        return self.attention.state_spec()

    def bind_state(self, state: Any) -> None:
        self.attention.bind_state(state)
