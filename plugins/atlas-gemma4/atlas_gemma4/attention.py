"""Gemma-4 self-attention (layer ``gemma4_attention``): q/k/v RMSNorms, per-layer-type head
size and rope, optional sliding window, keys reused as values on ``attention_k_eq_v`` layers."""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.api import (KVCacheSpec, Module, SlidingWindowCacheSpec, StepMetadata,
                            TransformerLayer)


def gemma4_cos_sin_cache(head_dim: int, max_position: int, rope: dict[str, Any]) -> np.ndarray:
    """Rotary table ``[max_position, head_dim]`` (cos half, sin half) over the whole head.

    ``default`` rope rotates every pair (``linear``: frequencies divided by ``factor``);
    ``proportional`` (full-attention layers) rotates the
    first ``int(partial_rotary_factor * head_dim // 2)`` frequencies of the ``head_dim`` spectrum
    and leaves the other pairs unrotated (zero frequency), as HF's proportional rope does.
    """
    rope_type = rope.get("rope_type", "default")
    base = np.float32(rope.get("rope_theta", 10000.0))
    if rope_type in ("default", "linear"):
        angles = head_dim // 2
    elif rope_type == "proportional":
        angles = int(float(rope.get("partial_rotary_factor", 1.0)) * head_dim // 2)
    else:
        raise ValueError(f"Gemma rope_type {rope_type!r} is not supported; supported: default, "
                         "linear, proportional")
    inv_freq = np.zeros(head_dim // 2, dtype=np.float32)
    exponents = np.arange(0, 2 * angles, 2, dtype=np.float32) / np.float32(head_dim)
    inv_freq[:angles] = np.float32(1.0) / base ** exponents
    inv_freq /= np.float32(rope.get("factor", 1.0))
    table = np.arange(max_position, dtype=np.float32)[:, None] * inv_freq[None, :]
    return np.concatenate([np.cos(table), np.sin(table)], axis=-1).astype(np.float32)


class Gemma4Attention(Module, TransformerLayer):
    """Attention of one Gemma-4 block.

    ``q = rope(q_norm(q_proj x))``, ``k = rope(k_norm(k_proj x))``, ``v = v_norm(v_proj x)``
    (``v_norm`` has no weight; with ``k_eq_v`` the values are the un-normed key projection), a
    softmax scale of 1 (the norms set the scale), then ``o_proj``. Every layer attends through
    the plugin op ``sliding_window_attention``: sliding layers over the last ``sliding_window``
    positions, full layers with window 0 (the whole context; their 512-wide heads are past core
    ``paged_attention``'s cuda kernels). Sliding layers declare a
    :class:`SlidingWindowCacheSpec`, so the engine keeps only their window in a pool of its own
    (``meta.window_block_tables`` / ``window_slot_mapping`` when it does).

    The rotary table is shared by every layer of a type: the model hands it over in
    :meth:`set_rotary` (``cos_sin_cache``).

    Args:
        hidden_size: model width.
        num_heads, num_kv_heads, head_dim: this layer's query heads, KV heads and head size.
        rope: this layer type's rope parameters (``rope_type``, ``rope_theta``…).
        rms_norm_eps: epsilon of the q/k/v norms.
        sliding_window: window length of sliding layers; None for full attention.
        k_eq_v: no ``v_proj``; values are the key projection.
        scale: softmax scale (Gemma-3: ``query_pre_attn_scalar ** -0.5``).
        v_norm: RMS-normalise the values (Gemma-4; Gemma-3 has no value norm).
        zero_centered: q/k norm weights are stored as ``w - 1`` (Gemma-3).
    """

    def __init__(self, *, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 rope: dict[str, Any], rms_norm_eps: float = 1e-6,
                 sliding_window: int | None = None, k_eq_v: bool = False, scale: float = 1.0,
                 v_norm: bool = True, zero_centered: bool = False) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_attention_heads ({num_heads}) must be a multiple of the "
                             f"layer's KV heads ({num_kv_heads})")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope, self.eps = dict(rope), rms_norm_eps
        self.sliding_window, self.k_eq_v = sliding_window, k_eq_v
        self.scale, self.has_v_norm, self.zero_centered = scale, v_norm, zero_centered
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        # One packed projection (q, k, then v unless the keys are the values): the prologue op
        # reads each head where it sits in a row of it.
        parts = [("q_proj.weight", (q_size, hidden_size)), ("k_proj.weight", (kv_size, hidden_size))]
        if not k_eq_v:
            parts.append(("v_proj.weight", (kv_size, hidden_size)))
        self.declare("qkv_proj.weight", (sum(shape[0] for _, shape in parts), hidden_size), parts)
        self.declare("o_proj.weight", (hidden_size, q_size))
        # zero-centred norms (Gemma-3) are kept in float32 with the + 1 folded in (exact)
        norm_dtype = np.float32 if zero_centered else None
        self.declare("q_norm.weight", (head_dim,), dtype=norm_dtype)
        self.declare("k_norm.weight", (head_dim,), dtype=norm_dtype)
        self.cos_sin_cache: Any = None
        self.v_norm: Any = None
        self.state: Any = None

    def rotary_key(self) -> tuple:
        """What the rotary table depends on (layers with equal keys share one table)."""
        return self.head_dim, tuple(sorted(self.rope.items()))

    def set_rotary(self, cos_sin_cache: Any) -> None:
        """Receive the shared device rotary table (from :func:`gemma4_cos_sin_cache`)."""
        self.cos_sin_cache = cos_sin_cache

    def setup(self) -> None:
        self.v_norm = self.backend.from_host(np.ones(self.head_dim, dtype=self.dtype))

    def post_load(self) -> None:
        """Fold the ``+ 1`` of zero-centred q/k norm weights in (float32, exact)."""
        if self.zero_centered:
            for name in ("q_norm.weight", "k_norm.weight"):
                param = self.params[name]
                self.backend.copy_from_host(param, self.backend.to_host(param) + np.float32(1.0))

    def state_spec(self) -> KVCacheSpec:
        if self.sliding_window:
            return SlidingWindowCacheSpec(num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                                          sliding_window=self.sliding_window)
        return KVCacheSpec(num_kv_heads=self.num_kv_heads, head_dim=self.head_dim)

    def bind_state(self, state: Any) -> None:
        """Receive ``(k_cache, v_cache)``, each
        ``[num_blocks, block_size, num_kv_heads, head_dim]``."""
        self.state = state

    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        return self._attend(self.ops.linear(hidden, self.params["qkv_proj.weight"]), meta), residual

    def forward_prenorm(self, hidden: Any, residual: Any | None, norm_weight: Any, eps: float,
                        zero_centered: bool, meta: StepMetadata) -> tuple[Any, Any]:
        """The block's input norm folded into ``qkv_proj`` (``ops.rms_norm_linear``: one
        kernel at decode on cuda)."""
        qkv, residual = self.ops.rms_norm_linear(hidden, residual, norm_weight, eps,
                                                 self.params["qkv_proj.weight"], None,
                                                 zero_centered)
        return self._attend(qkv, meta), residual

    def _attend(self, qkv: Any, meta: StepMetadata) -> Any:
        """q/k/v norms, rotary and the KV write as one ``qk_norm_rope_and_cache``, then
        ``sliding_window_attention`` and ``o_proj``."""
        if self.state is None:
            raise RuntimeError("attention layer has no KV cache; call model.bind_kv_caches() first")
        ops, p, t = self.ops, self.params, meta.num_tokens
        k_cache, v_cache = self.state
        tables, slots = meta.block_tables, meta.slot_mapping
        if self.sliding_window and meta.window_block_tables is not None:
            tables, slots = meta.window_block_tables, meta.window_slot_mapping
        # q: [num_tokens, num_heads, head_dim]
        q = ops.qk_norm_rope_and_cache(
            qkv, meta.positions, self.cos_sin_cache, k_cache, v_cache, slots,
            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            q_norm=p["q_norm.weight"], k_norm=p["k_norm.weight"], eps=self.eps,
            rotary_dim=self.head_dim, is_neox=True,
            v_norm=self.v_norm if self.has_v_norm else None, k_eq_v=self.k_eq_v)
        out = ops.sliding_window_attention(q, k_cache, v_cache, tables, meta.seq_lens,
                                           meta.cu_seqlens_q, self.scale, self.sliding_window or 0)
        return ops.linear(out.reshape(t, self.num_heads * self.head_dim), p["o_proj.weight"])
