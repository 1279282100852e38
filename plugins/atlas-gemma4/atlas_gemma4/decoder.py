"""The Gemma-4 block (layer ``gemma4_decoder``) and the routed experts of its MoE variant."""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.api import Module, StepMetadata, TransformerLayer, gated_activation


#: Bytes of experts' ``down_proj`` scaled at a time by :meth:`Gemma4Experts.fold_scale`.
FOLD_BYTES = 64 << 20


class Gemma4Experts:
    """The routed-expert side of a 26B-A4B block (``router.*`` and ``experts.*`` of the block).

    Router: ``rms_norm(h) * router.scale * hidden_size ** -0.5`` -> ``router.proj`` -> softmax
    over all experts -> top-k -> renormalised -> times ``router.per_expert_scale`` of each chosen
    expert (after loading, folded into that expert's ``down_proj``). Experts: stacked
    ``experts.gate_up_proj`` ``[E, 2I, H]`` (gate rows, then up rows)
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
        #: ``router.per_expert_scale`` is folded into ``experts.down_proj`` (:meth:`fold_scale`)
        self.scale_folded = False

    def declare(self, block: Module) -> None:
        """Declare the router and expert parameters on ``block``."""
        e, h, i = self.num_experts, self.hidden_size, self.intermediate_size
        block.declare("router.proj.weight", (e, h))
        block.declare("router.scale", (h,))
        block.declare("router.per_expert_scale", (e,))
        block.declare("experts.gate_up_proj", (e, 2 * i, h))
        block.declare("experts.down_proj", (e, h, i))

    def fold_scale(self, block: Module) -> None:
        """Multiply each expert's ``down_proj`` by its ``router.per_expert_scale`` (the experts'
        output is linear in it), so the forward skips the per-step ``mul_gathered`` (a launch a
        block at decode on cuda). On the device, :data:`FOLD_BYTES` of experts at a time
        (``mul``, then a copy back); one rounding of each weight to its dtype, where HF
        rounds the scaled router weight instead. Quantized ``down_proj`` weights keep the
        separate op."""
        from atlas_core.api import QuantizedWeight
        down, scale = block.params["experts.down_proj"], block.params["router.per_expert_scale"]
        if isinstance(down, QuantizedWeight):
            return
        e = self.num_experts
        per_expert = down.size // e
        flat, scales = down.reshape(down.size), scale.reshape(e)
        group = max(1, FOLD_BYTES // (per_expert * down.dtype.itemsize))
        for e0 in range(0, e, group):
            g = min(group, e - e0)
            rows = flat[e0 * per_expert:(e0 + g) * per_expert].reshape(g, per_expert)
            block.backend.copy_(rows, block.ops.mul(rows, scales[e0:e0 + g].reshape(g, 1)))
            block.backend.reset_workspace()
        self.scale_folded = True

    def __call__(self, ops: Any, params: dict[str, Any], hidden: Any, experts_in: Any,
                 eps: float) -> Any:
        """Route on ``hidden`` (the residual stream), run the experts on ``experts_in``.
        ``router.scale`` holds ``scale * hidden_size ** -0.5`` (folded at load, see
        :meth:`Gemma4DecoderLayer.post_load`), so the norm and the router projection are one
        ``rms_norm_linear``."""
        logits, _ = ops.rms_norm_linear(hidden, None, params["router.scale"], eps,
                                        params["router.proj.weight"])
        weights, ids = ops.moe_route(logits, self.top_k, True)
        if not self.scale_folded:
            # weights, ids: [num_tokens, top_k]; times the chosen experts' per_expert_scale
            weights = ops.mul_gathered(weights, ids, params["router.per_expert_scale"])
        return ops.moe_experts(experts_in, params["experts.gate_up_proj"],
                               params["experts.down_proj"], weights, ids, self.activation)


class Gemma4DecoderLayer(Module, TransformerLayer):
    """``h += post_attention_layernorm(attn(input_layernorm(h)))``, then
    ``h += post_feedforward_layernorm(ffn)`` and ``h *= layer_scalar``.

    ``ffn`` is ``mlp(pre_feedforward_layernorm(h))``; with a MoE it is
    ``post_feedforward_layernorm_1(that) + post_feedforward_layernorm_2(moe(h))`` where the experts
    take ``pre_feedforward_layernorm_2(h)``. Gemma-3 blocks (no ``layer_scalar``, zero-centred
    norm weights) are the same block with two switches.
    The block returns the whole residual stream (no residual carried to the next block).

    Four ops after the attention: ``ffn_in`` (the post-attention norm, the residual add, the
    pre-feed-forward norm with the MLP's gate/up and activation, and the experts' input norm:
    one kernel at decode on cuda), the MLP's down projection, the experts (a MoE block), and
    ``ffn_out`` (the post-feed-forward norms, the residual add and ``layer_scalar``); each
    rounds as the separate core ops it replaces.

    Args:
        attention: the ``gemma4_attention`` layer.
        mlp: the dense ``mlp`` (GeGLU).
        experts: the routed experts (:class:`Gemma4Experts`) of a MoE block, or None.
        hidden_size: model width.
        rms_norm_eps: norm epsilon.
        layer_scalar: the block has a ``layer_scalar`` (Gemma-4; not Gemma-3).
        zero_centered: norm weights are stored as ``w - 1`` (Gemma-3).
    """

    def __init__(self, attention: TransformerLayer, mlp: TransformerLayer,
                 experts: Gemma4Experts | None = None, *, hidden_size: int,
                 rms_norm_eps: float, layer_scalar: bool = True,
                 zero_centered: bool = False) -> None:
        super().__init__()
        self.attention, self.mlp, self.moe, self.eps = attention, mlp, experts, rms_norm_eps
        self.hidden_size, self.zero_centered = hidden_size, zero_centered
        self.add("self_attn", attention)
        self.add("mlp", mlp)
        norms = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"]
        if experts is not None:
            experts.declare(self)
            self.top_k = experts.top_k  # the step-bytes count reads the experts a token touches
            norms += ["pre_feedforward_layernorm_2", "post_feedforward_layernorm_1",
                      "post_feedforward_layernorm_2"]
        for name in norms:
            self.declare(f"{name}.weight", (hidden_size,))
        if layer_scalar:
            self.declare("layer_scalar", (1,))

    def post_load(self) -> None:
        """Fold the router's ``hidden_size ** -0.5`` into ``router.scale`` (one rounding to the
        model dtype, where HF rounds the two products in turn) and the per-expert scale into
        the experts' ``down_proj`` (:meth:`Gemma4Experts.fold_scale`)."""
        if self.moe is not None:
            param = self.params["router.scale"]
            scale = self.backend.to_host(param).astype(np.float32)
            self.backend.copy_from_host(
                param, (scale * np.float32(self.hidden_size ** -0.5)).astype(param.dtype))
            self.moe.fold_scale(self)

    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        ops, p = self.ops, self.params
        if residual is not None:
            hidden = ops.add(hidden, residual)
        attn, _ = self.attention.forward_prenorm(hidden, None, p["input_layernorm.weight"],
                                                 self.eps, self.zero_centered, meta)
        # post_attention_layernorm(attn) + hidden, pre_feedforward_layernorm of that into the
        # GeGLU's gate/up, and (MoE) pre_feedforward_layernorm_2 of it: the experts' input
        mlp = self.mlp
        act, hidden, experts_in = ops.ffn_in(
            attn, hidden, p["post_attention_layernorm.weight"],
            p["pre_feedforward_layernorm.weight"], self.param("pre_feedforward_layernorm_2.weight"),
            self.eps, mlp.params["gate_up_proj.weight"], mlp.param("gate_up_proj.bias"),
            self.zero_centered, mlp.activation)
        ffn = mlp.down(act)
        routed = norm1 = norm2 = None
        if self.moe is not None:
            routed = self.moe(ops, p, hidden, experts_in, self.eps)
            norm1 = p["post_feedforward_layernorm_1.weight"]
            norm2 = p["post_feedforward_layernorm_2.weight"]
        # the post-feed-forward norms, the residual add and layer_scalar as one op (one kernel
        # on cuda for six launches), rounding as the separate ops
        hidden = ops.ffn_out(hidden, ffn, norm1, routed, norm2,
                             p["post_feedforward_layernorm.weight"], self.param("layer_scalar"),
                             self.eps, self.zero_centered)
        return hidden, None

    def state_spec(self) -> Any:
        return self.attention.state_spec()

    def bind_state(self, state: Any) -> None:
        self.attention.bind_state(state)
