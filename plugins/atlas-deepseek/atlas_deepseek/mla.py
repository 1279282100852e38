"""Multi-head latent attention (layer ``mla_attention``): DeepSeek-V2/V3, Kimi-K2, Mistral-4."""

from __future__ import annotations

import json
import math
import weakref
from typing import Any

from atlas_core.api import (LatentCacheSpec, Module, StepMetadata, TransformerLayer,
                            rope_cos_sin_cache, rope_parameters)

#: The ops every step needs; the expanded prefill path needs :data:`EXPANDED_OPS` too.
DECODE_OPS = ("mla_latent_cache", "mla_rope_query", "mla_absorb_query",
              "mla_absorbed_attention", "mla_absorb_output")
EXPANDED_OPS = ("mla_gather_latent", "mla_expanded_attention")

#: Backend -> {(rope_dim, positions, rope settings): device cos/sin table}: the layers of a model
#: share one table (163840 positions x 64 float32 is 42 MB, once instead of once a layer).
_ROPE_TABLES: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def yarn_mscale(factor: float, mscale: float) -> float:
    """DeepSeek's yarn ``0.1 * mscale * ln(factor) + 1`` (1 for factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def mla_softmax_scale(qk_head_dim: int, rope: dict[str, Any]) -> float:
    """``qk_head_dim ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2`` for a scaled rope
    with ``mscale_all_dim`` (HF ``yarn_apply_mscale``)."""
    scale = qk_head_dim ** -0.5
    if rope.get("rope_type", "default") != "default" and rope.get("mscale_all_dim"):
        m = yarn_mscale(float(rope["factor"]), float(rope["mscale_all_dim"]))
        scale *= m * m
    return scale


class MLAttention(Module, TransformerLayer):
    """Multi-head latent attention over a paged latent cache.

    Queries: ``q_proj`` (``q_lora_rank`` None) or ``q_a_proj`` -> ``q_a_layernorm`` ->
    ``q_b_proj``; keys and values: ``kv_a_proj_with_mqa`` gives the latent (``kv_lora_rank``,
    normed by ``kv_a_layernorm``) and one shared rope key (``qk_rope_head_dim``), which
    ``mla_latent_cache`` writes to the cache; ``kv_b_proj`` expands the latent per head. Rope
    covers the ``qk_rope_head_dim`` features only (interleaved pairs with ``rope_interleave``).

    Steps with a prefill chunk run expanded (``mla_gather_latent`` -> ``kv_b_proj`` ->
    ``mla_expanded_attention``); decode steps run absorbed (``mla_absorb_query`` ->
    ``mla_absorbed_attention`` over the cache -> ``mla_absorb_output``), which is also the
    prefill path on a backend without the expanded ops and over an fp8 latent cache.

    Args:
        hidden_size, num_heads: model width and attention heads.
        q_lora_rank: query compression rank, or None for a plain ``q_proj``.
        kv_lora_rank: latent width.
        qk_nope_head_dim, qk_rope_head_dim, v_head_dim: per-head widths.
        rope: ``rope_parameters(config)`` (yarn with ``mscale_all_dim`` changes the softmax scale).
        max_position_embeddings: rotary table length.
        rms_norm_eps: epsilon of the latent norms.
        rope_interleave: rotate interleaved pairs (DeepSeek / Mistral-4 default) instead of halves.
        attention_bias: biases on ``q_a_proj`` (or ``q_proj``), ``kv_a_proj_with_mqa``, ``o_proj``.
        llama4_scaling_beta: Mistral-4's ``llama_4_scaling_beta`` (0: none); queries at position
            ``p`` are multiplied by ``1 + beta * log(1 + floor(p / original))`` with ``original``
            the rope's ``original_max_position_embeddings``.
    """

    def __init__(self, *, hidden_size: int, num_heads: int, q_lora_rank: int | None,
                 kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                 v_head_dim: int, rope: dict[str, Any], max_position_embeddings: int,
                 rms_norm_eps: float = 1e-6, rope_interleave: bool = True,
                 attention_bias: bool = False, llama4_scaling_beta: float = 0.0) -> None:
        super().__init__()
        if qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim ({qk_rope_head_dim}) must be even")
        self.num_heads, self.q_lora_rank, self.kv_lora_rank = num_heads, q_lora_rank, kv_lora_rank
        self.nope_dim, self.rope_dim = qk_nope_head_dim, qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.rope = dict(rope) if "rope_type" in rope else rope_parameters(rope)
        self.max_position_embeddings, self.eps = max_position_embeddings, rms_norm_eps
        self.is_neox = not rope_interleave
        self.scale = mla_softmax_scale(self.qk_head_dim, self.rope)
        self.llama4_beta = float(llama4_scaling_beta or 0.0)
        self.llama4_original = int(self.rope.get("original_max_position_embeddings")
                                   or max_position_embeddings)
        self._declare(hidden_size, attention_bias)
        self.cos_sin_cache: Any = None
        self.state: Any = None

    def _declare(self, hidden: int, bias: bool) -> None:
        h, q_out = self.num_heads, self.num_heads * self.qk_head_dim
        if self.q_lora_rank is None:
            self.declare("q_proj.weight", (q_out, hidden))
        else:
            self.declare("q_a_proj.weight", (self.q_lora_rank, hidden))
            self.declare("q_a_layernorm.weight", (self.q_lora_rank,))
            self.declare("q_b_proj.weight", (q_out, self.q_lora_rank))
            if bias:
                self.declare("q_a_proj.bias", (self.q_lora_rank,))
        self.declare("kv_a_proj_with_mqa.weight", (self.kv_lora_rank + self.rope_dim, hidden))
        self.declare("kv_a_layernorm.weight", (self.kv_lora_rank,))
        # read per head by the absorbed ops: kept as a plain (dequantized) array
        self.declare("kv_b_proj.weight", (h * (self.nope_dim + self.v_head_dim), self.kv_lora_rank),
                     quantizable=False)
        self.declare("o_proj.weight", (hidden, h * self.v_head_dim))
        if bias:
            self.declare("kv_a_proj_with_mqa.bias", (self.kv_lora_rank + self.rope_dim,))
            self.declare("o_proj.bias", (hidden,))

    def setup(self) -> None:
        missing = [name for name in DECODE_OPS if name not in self.ops]
        if missing:
            raise RuntimeError(
                f"multi-head latent attention needs the ops {missing}, which this "
                f"{type(self.backend).__name__} has no implementation of; on cuda install "
                "atlas-deepseek[cuda], or run on the numpy backend")
        tables = _ROPE_TABLES.setdefault(self.backend, {})
        key = (self.rope_dim, self.max_position_embeddings,
               json.dumps(self.rope, sort_keys=True, default=str))
        if key not in tables:
            tables[key] = self.backend.from_host(rope_cos_sin_cache(
                self.rope_dim, self.max_position_embeddings, self.rope,
                self.max_position_embeddings))
        self.cos_sin_cache = tables[key]

    def state_spec(self) -> LatentCacheSpec:
        return LatentCacheSpec.of(self.kv_lora_rank, self.rope_dim)

    def bind_state(self, state: Any) -> None:
        """Receive ``(latent_cache,)``: ``[num_blocks, block_size, 1, kv_lora_rank + rope_dim]``."""
        self.state = state

    def _query(self, hidden: Any) -> Any:
        ops, p = self.ops, self.params
        if self.q_lora_rank is None:
            return ops.linear(hidden, p["q_proj.weight"])
        qa = ops.linear(hidden, p["q_a_proj.weight"], self.param("q_a_proj.bias"))
        qa = ops.rms_norm(qa, p["q_a_layernorm.weight"], self.eps)
        return ops.linear(qa, p["q_b_proj.weight"])

    def _is_expanded(self, cache: Any, meta: StepMetadata) -> bool:
        return (not meta.is_decode and "seq_lens" in meta.host and cache.dtype == self.dtype
                and all(name in self.ops for name in EXPANDED_OPS))

    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        if self.state is None:
            raise RuntimeError("MLA layer has no latent cache; call model.bind_kv_caches() first")
        ops, p, t, h = self.ops, self.params, meta.num_tokens, self.num_heads
        (cache,) = self.state
        kv_a = ops.linear(hidden, p["kv_a_proj_with_mqa.weight"],
                          self.param("kv_a_proj_with_mqa.bias"))
        ops.mla_latent_cache(kv_a, p["kv_a_layernorm.weight"], self.eps, meta.positions,
                             self.cos_sin_cache, cache, meta.slot_mapping,
                             kv_lora_rank=self.kv_lora_rank, is_neox=self.is_neox)
        # q_nope: [num_tokens, num_heads, nope_dim]; q_pe: [num_tokens, num_heads, rope_dim]
        q_nope, q_pe = ops.mla_rope_query(
            self._query(hidden).reshape(t, h, self.qk_head_dim), meta.positions,
            self.cos_sin_cache, nope_dim=self.nope_dim, is_neox=self.is_neox,
            attn_scale_beta=self.llama4_beta, attn_scale_original=self.llama4_original)
        w_kv_b = p["kv_b_proj.weight"]
        if self._is_expanded(cache, meta):
            seq_lens = meta.host["seq_lens"][:meta.num_seqs]
            n = int(seq_lens.sum())
            c, k_pe = ops.mla_gather_latent(cache, meta.block_tables, meta.seq_lens, n,
                                            self.kv_lora_rank)
            kv = ops.linear(c, w_kv_b).reshape(n, h, self.nope_dim + self.v_head_dim)
            out = ops.mla_expanded_attention(q_nope, q_pe, kv, k_pe, meta.seq_lens,
                                             meta.cu_seqlens_q, self.scale)
        else:
            q_lat = ops.mla_absorb_query(q_nope, w_kv_b)
            o_lat = ops.mla_absorbed_attention(q_lat, q_pe, cache, meta.block_tables,
                                               meta.seq_lens, meta.cu_seqlens_q, self.scale)
            out = ops.mla_absorb_output(o_lat, w_kv_b, self.v_head_dim)
        out = out.reshape(t, h * self.v_head_dim)
        return ops.linear(out, p["o_proj.weight"], self.param("o_proj.bias")), residual
