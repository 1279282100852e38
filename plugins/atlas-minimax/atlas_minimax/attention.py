"""MiniMax-M2 attention: q/k RMSNorm over the whole projection, partial rotary (layer
``minimax_m2_attention``)."""

from __future__ import annotations

from typing import Any

from atlas_core.api import (KVCacheSpec, Module, StepMetadata, TransformerLayer,
                            rope_cos_sin_cache, rope_parameters)


class MiniMaxM2Attention(Module, TransformerLayer):
    """GQA self-attention over the paged KV cache whose ``q_norm`` / ``k_norm`` normalise each
    token's whole query projection (``num_heads * head_dim`` features) and whole key projection
    (``num_kv_heads * head_dim``), as HF ``MiniMaxM2Attention`` does, instead of one
    ``[head_dim]`` norm per head.

    Each step: ``linear`` (``q_proj``, ``k_proj``, ``v_proj``) -> ``rms_norm`` of q and of k ->
    ``rotary_embedding`` (first ``rotary_dim`` features of each head, from
    ``rope["partial_rotary_factor"]``) -> ``reshape_and_cache`` -> ``paged_attention`` ->
    ``linear`` (``o_proj``): core ops on contiguous arrays only, so every backend runs it. The
    decoder's input norm runs before it (the default ``forward_prenorm``).

    Args:
        hidden_size: model width.
        num_heads, num_kv_heads, head_dim: query heads, KV heads (GQA) and per-head size.
        rope: ``rope_parameters(config)`` output (``partial_rotary_factor`` included).
        max_position_embeddings: rotary table length.
        rms_norm_eps: epsilon of the q/k norms.
    """

    def __init__(self, *, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 rope: dict[str, Any], max_position_embeddings: int,
                 rms_norm_eps: float = 1e-6) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_attention_heads ({num_heads}) must be a multiple of "
                             f"num_key_value_heads ({num_kv_heads})")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope = dict(rope) if "rope_type" in rope else rope_parameters(rope)
        self.rotary_dim = int(head_dim * float(self.rope.get("partial_rotary_factor", 1.0)))
        self.max_position_embeddings, self.eps = max_position_embeddings, rms_norm_eps
        self.scale = head_dim ** -0.5
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.declare("q_proj.weight", (q_size, hidden_size))
        self.declare("k_proj.weight", (kv_size, hidden_size))
        self.declare("v_proj.weight", (kv_size, hidden_size))
        self.declare("o_proj.weight", (hidden_size, q_size))
        self.declare("q_norm.weight", (q_size,))
        self.declare("k_norm.weight", (kv_size,))
        self.cos_sin_cache: Any = None
        self.state: Any = None

    def setup(self) -> None:
        table = rope_cos_sin_cache(self.rotary_dim, self.max_position_embeddings, self.rope,
                                   self.max_position_embeddings)
        self.cos_sin_cache = self.backend.from_host(table)

    def state_spec(self) -> KVCacheSpec:
        return KVCacheSpec(num_kv_heads=self.num_kv_heads, head_dim=self.head_dim)

    def bind_state(self, state: Any) -> None:
        """Receive ``(k_cache, v_cache)``, each
        ``[num_blocks, block_size, num_kv_heads, head_dim]``."""
        self.state = state

    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        if self.state is None:
            raise RuntimeError("attention layer has no KV cache; call model.bind_kv_caches() first")
        ops, p, t = self.ops, self.params, meta.num_tokens
        k_cache, v_cache = self.state
        q = ops.rms_norm(ops.linear(hidden, p["q_proj.weight"]), p["q_norm.weight"], self.eps)
        k = ops.rms_norm(ops.linear(hidden, p["k_proj.weight"]), p["k_norm.weight"], self.eps)
        v = ops.linear(hidden, p["v_proj.weight"])
        # q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim]
        q, k = ops.rotary_embedding(
            q.reshape(t, self.num_heads, self.head_dim),
            k.reshape(t, self.num_kv_heads, self.head_dim), meta.positions, self.cos_sin_cache,
            self.rotary_dim, True)
        ops.reshape_and_cache(k, v.reshape(t, self.num_kv_heads, self.head_dim), k_cache,
                              v_cache, meta.slot_mapping)
        out = ops.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                  meta.cu_seqlens_q, self.scale)
        out = out.reshape(t, self.num_heads * self.head_dim)
        return ops.linear(out, p["o_proj.weight"]), residual
