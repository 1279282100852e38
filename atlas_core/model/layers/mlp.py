"""Gated feed-forward block (layer ``mlp``): ``down(act(gate(x)) * up(x))``."""

from __future__ import annotations

from typing import Any

from atlas_core.interfaces.layer import TransformerLayer
from atlas_core.interfaces.metadata import StepMetadata
from atlas_core.model.params import Module

#: HF ``hidden_act`` values -> the activation name of the gated ops.
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}


def gated_activation(hidden_act: str) -> str:
    """Map an HF ``hidden_act`` to ``"silu"`` or ``"gelu_tanh"``; ``ValueError`` otherwise."""
    try:
        return ACTIVATIONS[hidden_act]
    except KeyError:
        raise ValueError(f"unsupported hidden_act {hidden_act!r}; supported: "
                         f"{', '.join(ACTIVATIONS)}") from None


class GatedMLP(Module, TransformerLayer):
    """SwiGLU / GeGLU MLP with the gate and up projections fused into ``gate_up_proj``
    (``linear_act_and_mul`` then ``linear``).

    Args:
        hidden_size: model width.
        intermediate_size: width of the gate and up projections.
        hidden_act: HF activation name (``silu``, ``gelu_pytorch_tanh``…).
        bias: biases on all three projections (Llama ``mlp_bias``).
    """

    def __init__(self, *, hidden_size: int, intermediate_size: int, hidden_act: str = "silu",
                 bias: bool = False) -> None:
        super().__init__()
        self.activation = gated_activation(hidden_act)
        inter = intermediate_size
        self.declare("gate_up_proj.weight", (2 * inter, hidden_size), [
            ("gate_proj.weight", (inter, hidden_size)), ("up_proj.weight", (inter, hidden_size))])
        self.declare("down_proj.weight", (hidden_size, inter))
        if bias:
            self.declare("gate_up_proj.bias", (2 * inter,), [
                ("gate_proj.bias", (inter,)), ("up_proj.bias", (inter,))])
            self.declare("down_proj.bias", (hidden_size,))

    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        act = self.ops.linear_act_and_mul(hidden, self.params["gate_up_proj.weight"],
                                          self.param("gate_up_proj.bias"), self.activation)
        return self.down(act), residual

    def forward_prenorm(self, hidden: Any, residual: Any | None, norm_weight: Any, eps: float,
                        zero_centered: bool, meta: StepMetadata) -> tuple[Any, Any]:
        """The decoder's post-attention norm folded into ``gate_up_proj``
        (``ops.rms_norm_linear`` with the activation); see
        :class:`~atlas_core.model.layers.decoder.DecoderLayer`."""
        act, residual = self.ops.rms_norm_linear(
            hidden, residual, norm_weight, eps, self.params["gate_up_proj.weight"],
            self.param("gate_up_proj.bias"), zero_centered, self.activation)
        return self.down(act), residual

    def down(self, act: Any) -> Any:
        """The down projection (with its bias) of the activated gate/up ``act``
        ``[..., intermediate_size]``: for a caller that computed ``act`` itself (Gemma's
        ``ffn_in``, which folds the block's norms into the gate/up projection)."""
        return self.ops.linear(act, self.params["down_proj.weight"], self.param("down_proj.bias"))
