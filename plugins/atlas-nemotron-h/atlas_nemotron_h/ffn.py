"""Nemotron-H feed-forward blocks: the squared-ReLU MLP (layer ``relu2_mlp``) and the routed +
shared expert MoE (layer ``nemotron_h_moe``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.api import Module, QuantizedWeight, StepMetadata, TransformerLayer


class ReLU2MLP(Module, TransformerLayer):
    """``down_proj(relu2(up_proj(x)))``, no gate (HF ``NemotronHMLP``).

    Args:
        hidden_size: model width.
        intermediate_size: width of ``up_proj``.
        bias: biases on both projections (``mlp_bias``).
    """

    def __init__(self, *, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.declare("up_proj.weight", (intermediate_size, hidden_size))
        self.declare("down_proj.weight", (hidden_size, intermediate_size))
        if bias:
            self.declare("up_proj.bias", (intermediate_size,))
            self.declare("down_proj.bias", (hidden_size,))

    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        up = self.ops.linear(hidden, self.params["up_proj.weight"], self.param("up_proj.bias"))
        return self._down(up), residual

    def forward_prenorm(self, hidden: Any, residual: Any | None, norm_weight: Any, eps: float,
                        zero_centered: bool, meta: StepMetadata) -> tuple[Any, Any]:
        """The block's norm folded into ``up_proj`` (``ops.rms_norm_linear``)."""
        up, residual = self.ops.rms_norm_linear(hidden, residual, norm_weight, eps,
                                                self.params["up_proj.weight"],
                                                self.param("up_proj.bias"), zero_centered)
        return self._down(up), residual

    def _down(self, up: Any) -> Any:
        return self.ops.linear(self.ops.relu2(up), self.params["down_proj.weight"],
                               self.param("down_proj.bias"))


class NemotronHMoE(Module, TransformerLayer):
    """Routed non-gated experts plus a shared squared-ReLU expert (HF ``NemotronHMoE``).

    ``nemotron_h_moe_route`` (sigmoid scores, ``e_score_correction_bias`` steering the
    choice, grouped top-k, renormalised and scaled weights) -> optional ``fc1_latent_proj`` ->
    ``nemotron_h_moe_experts`` -> optional ``fc2_latent_proj``, plus ``shared_experts`` over
    the block input. Per-expert checkpoint tensors ``experts.{e}.up_proj.weight`` /
    ``down_proj.weight`` are stacked at load into ``experts.up_proj`` ``[E, I, in]`` and
    ``experts.down_proj`` ``[E, in, I]`` (stacked tensors of those names are taken too);
    ``in`` is ``moe_latent_size`` when set, else ``hidden_size``. The router stays float32.
    Without a latent projection, biases or quantized shared weights (:attr:`fused_shared`) the
    shared expert's weights go into ``nemotron_h_moe_experts`` (its input is then the routed
    experts' input): one op, whose cuda decode kernels run it with the routed experts, instead
    of two GEMVs, relu2 and add.

    Args:
        hidden_size: model width.
        num_experts, num_experts_per_tok: ``n_routed_experts``, top-k.
        moe_intermediate_size: routed expert width.
        shared_intermediate_size: ``moe_shared_expert_intermediate_size``.
        n_group, topk_group: expert groups and groups kept per token.
        norm_topk_prob: renormalise the chosen weights.
        routed_scaling_factor: scale of the routed weights.
        latent_size: ``moe_latent_size`` (None: experts work at ``hidden_size``).
        bias: biases on the shared expert and latent projections (``mlp_bias``).
    """

    def __init__(self, *, hidden_size: int, num_experts: int, num_experts_per_tok: int,
                 moe_intermediate_size: int, shared_intermediate_size: int, n_group: int = 1,
                 topk_group: int = 1, norm_topk_prob: bool = True,
                 routed_scaling_factor: float = 1.0, latent_size: int | None = None,
                 bias: bool = False) -> None:
        super().__init__()
        if not 0 < num_experts_per_tok <= num_experts:
            raise ValueError(f"num_experts_per_tok ({num_experts_per_tok}) must be in "
                             f"1..n_routed_experts ({num_experts})")
        if num_experts % n_group or not 0 < topk_group <= n_group:
            raise ValueError(f"n_group ({n_group}) must divide n_routed_experts ({num_experts}) "
                             f"and topk_group ({topk_group}) be in 1..n_group")
        self.top_k = num_experts_per_tok
        self.route = dict(top_k=num_experts_per_tok, n_group=n_group, topk_group=topk_group,
                          renormalize=norm_topk_prob,
                          routed_scaling_factor=float(routed_scaling_factor))
        e, h, i, width = num_experts, hidden_size, moe_intermediate_size, latent_size or hidden_size
        self.declare("gate.weight", (e, h), dtype=np.float32)
        self.declare("gate.e_score_correction_bias", (e,), dtype=np.float32)
        self.declare("experts.up_proj", (e, i, width),
                     [[(f"experts.{x}.up_proj.weight", (i, width)) for x in range(e)],
                      [("experts.up_proj", (e, i, width))]])
        self.declare("experts.down_proj", (e, width, i),
                     [[(f"experts.{x}.down_proj.weight", (width, i)) for x in range(e)],
                      [("experts.down_proj", (e, width, i))]])
        self.add("shared_experts", ReLU2MLP(hidden_size=h, bias=bias,
                                            intermediate_size=shared_intermediate_size))
        self.latent = latent_size is not None
        self.mlp_bias = bias
        if self.latent:
            self.declare("fc1_latent_proj.weight", (latent_size, h))
            self.declare("fc2_latent_proj.weight", (h, latent_size))
            if bias:
                self.declare("fc1_latent_proj.bias", (latent_size,))
                self.declare("fc2_latent_proj.bias", (h,))

    @property
    def fused_shared(self) -> bool:
        """Whether the shared expert runs inside ``nemotron_h_moe_experts`` (then that op, not
        ``add``, ends the block: the parallel rule all-reduces it). Read after loading."""
        if self.latent or self.mlp_bias:
            return False
        sp = self.children["shared_experts"].params
        return not any(isinstance(sp.get(n), QuantizedWeight)
                       for n in ("up_proj.weight", "down_proj.weight"))

    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        ops, p = self.ops, self.params
        weights, ids = ops.nemotron_h_moe_route(hidden, p["gate.weight"],
                                             p["gate.e_score_correction_bias"], **self.route)
        shared_mlp = self.children["shared_experts"]
        if self.fused_shared:
            sp = shared_mlp.params
            out = ops.nemotron_h_moe_experts(hidden, p["experts.up_proj"], p["experts.down_proj"],
                                             weights, ids, sp["up_proj.weight"],
                                             sp["down_proj.weight"])
            return out, residual
        x = hidden
        if self.latent:
            x = ops.linear(x, p["fc1_latent_proj.weight"], self.param("fc1_latent_proj.bias"))
        out = ops.nemotron_h_moe_experts(x, p["experts.up_proj"], p["experts.down_proj"], weights,
                                         ids)
        if self.latent:
            out = ops.linear(out, p["fc2_latent_proj.weight"], self.param("fc2_latent_proj.bias"))
        shared, _ = shared_mlp.forward(hidden, None, meta)
        return ops.add(out, shared), residual
