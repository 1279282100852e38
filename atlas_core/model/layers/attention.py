"""Paged multi-head attention with GQA, rotary, optional q/k norm and biases (layer ``attention``)."""

from __future__ import annotations

from typing import Any

from atlas_core.interfaces.layer import KVCacheSpec, TransformerLayer
from atlas_core.interfaces.metadata import StepMetadata
from atlas_core.model.params import Module
from atlas_core.ops.rotary import rope_cos_sin_cache, rope_parameters


class Attention(Module, TransformerLayer):
    """Self-attention over the paged KV cache (prefill and decode alike).

    The q/k/v projections are one fused ``qkv_proj`` (packed at load from ``q_proj``, ``k_proj``,
    ``v_proj``). Each step: ``linear`` -> ``rope_cache_attention`` (split, optional per-head
    RMSNorm, rotary, KV write, paged attention: one kernel on decode steps where the backend
    fuses it) -> ``linear`` (``o_proj``).

    Args:
        hidden_size: model width.
        num_heads, num_kv_heads, head_dim: query heads, KV heads (GQA) and per-head size.
        rope: the output of ``rope_parameters(config)`` (``rope_type``, ``rope_theta``, scaling
            fields, ``partial_rotary_factor``), or a config dict to normalise.
        max_position_embeddings: rotary table length.
        rms_norm_eps: epsilon of the q/k norms.
        qk_norm: per-head RMSNorm of q and k (``q_norm.weight``, ``k_norm.weight``; Qwen3).
        qkv_bias, o_bias: biases on the q/k/v and o projections.
        is_neox: rotate halves (HF ``rotate_half``) rather than interleaved pairs.
        scale: softmax scale (default ``head_dim ** -0.5``).
    """

    def __init__(self, *, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 rope: dict[str, Any], max_position_embeddings: int, rms_norm_eps: float = 1e-6,
                 qk_norm: bool = False, qkv_bias: bool = False, o_bias: bool = False,
                 is_neox: bool = True, scale: float | None = None) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_attention_heads ({num_heads}) must be a multiple of "
                             f"num_key_value_heads ({num_kv_heads})")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope = dict(rope) if "rope_type" in rope else rope_parameters(rope)
        self.rotary_dim = int(head_dim * float(self.rope.get("partial_rotary_factor", 1.0)))
        self.max_position_embeddings = max_position_embeddings
        self.eps, self.is_neox = rms_norm_eps, is_neox
        self.scale = scale if scale is not None else head_dim ** -0.5
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        qkv_rows = q_size + 2 * kv_size
        self.declare("qkv_proj.weight", (qkv_rows, hidden_size), [
            ("q_proj.weight", (q_size, hidden_size)), ("k_proj.weight", (kv_size, hidden_size)),
            ("v_proj.weight", (kv_size, hidden_size))])
        if qkv_bias:
            self.declare("qkv_proj.bias", (qkv_rows,), [
                ("q_proj.bias", (q_size,)), ("k_proj.bias", (kv_size,)), ("v_proj.bias", (kv_size,))])
        self.declare("o_proj.weight", (hidden_size, q_size))
        if o_bias:
            self.declare("o_proj.bias", (hidden_size,))
        if qk_norm:
            self.declare("q_norm.weight", (head_dim,))
            self.declare("k_norm.weight", (head_dim,))
        self.cos_sin_cache: Any = None
        self.state: Any = None

    def setup(self) -> None:
        table = rope_cos_sin_cache(self.rotary_dim, self.max_position_embeddings, self.rope,
                                   self.max_position_embeddings)
        self.cos_sin_cache = self.backend.from_host(table)

    def state_spec(self) -> KVCacheSpec:
        return KVCacheSpec(num_kv_heads=self.num_kv_heads, head_dim=self.head_dim)

    def bind_state(self, state: Any) -> None:
        """Receive ``(k_cache, v_cache)``, each ``[num_blocks, block_size, num_kv_heads, head_dim]``."""
        self.state = state

    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        self._check_state()
        qkv = self.ops.linear(hidden, self.params["qkv_proj.weight"], self.param("qkv_proj.bias"))
        return self._attend(qkv, meta), residual

    def forward_prenorm(self, hidden: Any, residual: Any | None, norm_weight: Any, eps: float,
                        zero_centered: bool, meta: StepMetadata) -> tuple[Any, Any]:
        """The decoder's input norm folded into ``qkv_proj`` (``ops.rms_norm_linear``); see
        :class:`~atlas_core.model.layers.decoder.DecoderLayer`."""
        self._check_state()
        qkv, residual = self.ops.rms_norm_linear(hidden, residual, norm_weight, eps,
                                                 self.params["qkv_proj.weight"],
                                                 self.param("qkv_proj.bias"), zero_centered)
        return self._attend(qkv, meta), residual

    def _check_state(self) -> None:
        if self.state is None:
            raise RuntimeError("attention layer has no KV cache; call model.bind_kv_caches() first")

    def _attend(self, qkv: Any, meta: StepMetadata) -> Any:
        """q/k norm, rotary and KV write, attention and ``o_proj`` of a projected ``qkv``."""
        return self.ops.linear(self._attention(qkv, meta), self.params["o_proj.weight"],
                               self.param("o_proj.bias"))

    def _attention(self, qkv: Any, meta: StepMetadata) -> Any:
        """``rope_cache_attention`` of a projected ``qkv``: ``[num_tokens, heads * head_dim]``."""
        k_cache, v_cache = self.state
        out = self.ops.rope_cache_attention(
            qkv, meta.positions, self.cos_sin_cache, k_cache, v_cache, meta.slot_mapping,
            meta.block_tables, meta.seq_lens, meta.cu_seqlens_q, self.scale,
            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            q_norm=self.param("q_norm.weight"), k_norm=self.param("k_norm.weight"), eps=self.eps,
            rotary_dim=self.rotary_dim, is_neox=self.is_neox)
        return out.reshape(meta.num_tokens, self.num_heads * self.head_dim)
