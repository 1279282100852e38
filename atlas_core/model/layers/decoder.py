"""The pre-norm decoder block: norm -> mixer -> norm -> feed-forward, residual fused into the norms."""

from __future__ import annotations

from typing import Any

from atlas_core.interfaces.layer import KVCacheSpec, RecurrentStateSpec, TransformerLayer
from atlas_core.interfaces.metadata import StepMetadata
from atlas_core.model.params import Module


class DecoderLayer(Module, TransformerLayer):
    """``input_layernorm`` -> mixer -> ``post_attention_layernorm`` -> feed-forward.

    The residual adds are fused into the RMSNorms (``rms_norm(x, w, eps, residual)`` returns the
    normed sum and the new residual), so the block returns the feed-forward output and the
    residual stream unsummed; the next block's first norm (or the model's final norm) adds them.

    Each norm goes to the layer behind it through
    :meth:`~atlas_core.interfaces.TransformerLayer.forward_prenorm`, so a mixer or feed-forward
    can fold the norm (and the residual add) into its first projection; layers that do not
    override it get ``rms_norm`` then ``forward``.

    Args:
        mixer: token mixer (``attention``, or a recurrent kind from a plugin), under ``mixer_name``.
        ffn: feed-forward block (``mlp`` / ``moe``) under ``ffn_name``, or ``None`` for
            mixer-only blocks (then there is no ``post_attention_layernorm``).
        hidden_size: model width.
        rms_norm_eps: norm epsilon.
        zero_centered: the norm weights are stored as ``w - 1`` (Gemma / Qwen3.5 style).
    """

    def __init__(self, mixer: TransformerLayer, ffn: TransformerLayer | None, *, hidden_size: int,
                 rms_norm_eps: float = 1e-6, mixer_name: str = "self_attn", ffn_name: str = "mlp",
                 zero_centered: bool = False) -> None:
        super().__init__()
        self.mixer, self.ffn = mixer, ffn
        self.eps, self.zero_centered = rms_norm_eps, zero_centered
        self.add(mixer_name, mixer)
        self.add(ffn_name, ffn)
        self.declare("input_layernorm.weight", (hidden_size,))
        if ffn is not None:
            self.declare("post_attention_layernorm.weight", (hidden_size,))

    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        hidden, residual = self.mixer.forward_prenorm(
            hidden, residual, self.params["input_layernorm.weight"], self.eps, self.zero_centered,
            meta)
        if self.ffn is not None:
            hidden, residual = self.ffn.forward_prenorm(
                hidden, residual, self.params["post_attention_layernorm.weight"], self.eps,
                self.zero_centered, meta)
        return hidden, residual

    def state_spec(self) -> KVCacheSpec | RecurrentStateSpec | None:
        return self.mixer.state_spec()

    def bind_state(self, state: Any) -> None:
        self.mixer.bind_state(state)
