"""Full attention with a sigmoid output gate and zero-centred q/k norms (layer ``gated_attention``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.api import Attention, StepMetadata
from atlas_qwen35.projections import norm_project_blocks, project_blocks


class GatedAttention(Attention):
    """Qwen3-Next / Qwen3.5 attention: :class:`~atlas_core.model.layers.attention.Attention` plus
    ``attn_output_gate`` and Gemma-style ``(1 + w)`` q/k norms.

    The checkpoint's ``q_proj`` holds, per head, ``head_dim`` query rows then ``head_dim`` gate
    rows. :meth:`post_load` reorders the fused ``qkv_proj.weight`` into
    ``[q heads, k heads, v heads, gate heads]`` so the step is two ``linear`` over row blocks of
    it, then ``rope_cache_attention`` -> ``sigmoid_mul`` (the gate) ->
    ``o_proj``. The q/k norm weights are kept in float32 with the ``+ 1`` folded in (exact).

    Partial rotary (``partial_rotary_factor``) comes through ``rope``. Qwen3.5's interleaved
    MRoPE reduces to plain rotary for text, whose three position streams are equal.

    Args:
        attn_output_gate: gate the attention output (Qwen3.5 ``attn_output_gate``, default on).
        zero_centered_qk_norm: q/k norm weights are stored as ``w - 1``.
        **kwargs: as :class:`Attention` (``qk_norm`` is forced on).
    """

    def __init__(self, *, attn_output_gate: bool = True, zero_centered_qk_norm: bool = True,
                 **kwargs: Any) -> None:
        if kwargs.get("qkv_bias"):
            raise ValueError("attention_bias is not supported for Qwen3-Next / Qwen3.5 attention")
        kwargs["qk_norm"] = True
        super().__init__(**kwargs)
        self.attn_output_gate, self.zero_centered_qk_norm = attn_output_gate, zero_centered_qk_norm
        hidden = kwargs["hidden_size"]
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        self.qkv_size = q_size + 2 * kv_size
        if attn_output_gate:
            self.declare("qkv_proj.weight", (self.qkv_size + q_size, hidden), [
                ("q_proj.weight", (2 * q_size, hidden)), ("k_proj.weight", (kv_size, hidden)),
                ("v_proj.weight", (kv_size, hidden))], quantizable=False)
        norm_dtype = np.float32 if zero_centered_qk_norm else None
        self.declare("q_norm.weight", (self.head_dim,), dtype=norm_dtype)
        self.declare("k_norm.weight", (self.head_dim,), dtype=norm_dtype)

    def setup(self) -> None:
        super().setup()
        qkv = self.params["qkv_proj.weight"]
        self.w_qkv = qkv[:self.qkv_size]
        self.w_gate = qkv[self.qkv_size:] if self.attn_output_gate else None

    def post_load(self) -> None:
        """Move the gate rows of ``q_proj`` behind ``v``; fold ``+ 1`` into the q/k norms."""
        backend = self.backend
        if self.attn_output_gate:
            param = self.params["qkv_proj.weight"]
            host = backend.to_host(param)
            q_size, d = self.num_heads * self.head_dim, self.head_dim
            q_gate = host[:2 * q_size].reshape(self.num_heads, 2, d, -1)
            query, gate = q_gate[:, 0].reshape(q_size, -1), q_gate[:, 1].reshape(q_size, -1)
            rows = [query, host[2 * q_size:], gate]
            backend.copy_from_host(param, np.ascontiguousarray(np.concatenate(rows, axis=0)))
        if self.zero_centered_qk_norm:
            for name in ("q_norm.weight", "k_norm.weight"):
                param = self.params[name]
                backend.copy_from_host(param, backend.to_host(param) + np.float32(1.0))

    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        self._check_state()
        if self.w_gate is None:
            return self._attend_gated(self.ops.linear(hidden, self.w_qkv), None, meta), residual
        qkv, gate = project_blocks(self.ops, hidden, self.params["qkv_proj.weight"],
                                   [self.qkv_size, self.w_gate.shape[0]])
        return self._attend_gated(qkv, gate, meta), residual

    def forward_prenorm(self, hidden: Any, residual: Any | None, norm_weight: Any, eps: float,
                        zero_centered: bool, meta: StepMetadata) -> tuple[Any, Any]:
        """The decoder's input norm folded into the q/k/v (+ gate) projection; see
        :class:`~atlas_core.model.layers.decoder.DecoderLayer`."""
        self._check_state()
        if self.w_gate is None:
            qkv, residual = self.ops.rms_norm_linear(hidden, residual, norm_weight, eps,
                                                     self.w_qkv, None, zero_centered)
            return self._attend_gated(qkv, None, meta), residual
        (qkv, gate), residual = norm_project_blocks(
            self.ops, hidden, residual, norm_weight, eps, zero_centered,
            self.params["qkv_proj.weight"], [self.qkv_size, self.w_gate.shape[0]])
        return self._attend_gated(qkv, gate, meta), residual

    def _attend_gated(self, qkv: Any, gate: Any | None, meta: StepMetadata) -> Any:
        out = self._attention(qkv, meta)
        if gate is not None:
            out = self.ops.sigmoid_mul(out, gate)
        return self.ops.linear(out, self.params["o_proj.weight"])
