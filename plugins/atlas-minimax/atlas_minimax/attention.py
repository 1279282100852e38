"""MiniMax-M2 attention: q/k RMSNorm over the whole projection, partial rotary (layer
``minimax_m2_attention``)."""

from __future__ import annotations

from typing import Any

from atlas_core.api import Attention, StepMetadata


class MiniMaxM2Attention(Attention):
    """:class:`~atlas_core.api.Attention` whose ``q_norm`` / ``k_norm`` normalise each token's
    whole query projection (``num_heads * head_dim`` features) and whole key projection
    (``num_kv_heads * head_dim``) with one weight of that width, as HF ``MiniMaxM2Attention``
    does, instead of one ``[head_dim]`` norm per head.

    Each step: ``linear`` (``qkv_proj``, the input norm folded in where the backend fuses it)
    -> ``rms_norm`` of the q and k column blocks -> ``rotary_embedding`` (first ``rotary_dim``
    features of each head, from ``rope["partial_rotary_factor"]``) -> ``reshape_and_cache`` ->
    ``paged_attention`` -> ``linear`` (``o_proj``): core ops only, so every backend runs it.

    Args:
        **kwargs: as :class:`~atlas_core.api.Attention`; ``qk_norm`` is always on (whole
            projection) and biases are not supported (M2 has none).
    """

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("qkv_bias") or kwargs.get("o_bias"):
            raise ValueError("attention_bias is not supported for MiniMaxM2ForCausalLM; set it "
                             "to false (MiniMax-M2 checkpoints have no attention biases)")
        kwargs["qk_norm"] = False
        super().__init__(**kwargs)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.declare("q_norm.weight", (self.q_size,))
        self.declare("k_norm.weight", (self.kv_size,))

    def _attention(self, qkv: Any, meta: StepMetadata) -> Any:
        k_cache, v_cache = self.state
        t, q_end, k_end = meta.num_tokens, self.q_size, self.q_size + self.kv_size
        q = self.ops.rms_norm(qkv[:, :q_end], self.params["q_norm.weight"], self.eps)
        k = self.ops.rms_norm(qkv[:, q_end:k_end], self.params["k_norm.weight"], self.eps)
        # q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim]
        q, k = self.ops.rotary_embedding(
            q.reshape(t, self.num_heads, self.head_dim),
            k.reshape(t, self.num_kv_heads, self.head_dim), meta.positions, self.cos_sin_cache,
            self.rotary_dim, self.is_neox)
        v = qkv[:, k_end:].reshape(t, self.num_kv_heads, self.head_dim)
        self.ops.reshape_and_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        out = self.ops.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                       meta.cu_seqlens_q, self.scale)
        return out.reshape(t, self.q_size)
