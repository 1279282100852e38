"""The vision-tower ops on the cuda backend: launches of ``vision.cu``.

The cuda backend builds one :class:`VisionCudaOps` per backend with its op context
(``ctx.kernel`` compiles through the NVRTC disk cache, ``ctx.out`` takes outputs from the step
workspace, ``ctx.launch`` launches on the backend's stream, ``ctx.ops`` is the backend's op
table).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_cuda.ops_attention import FLASH_HEAD_DIMS

#: Threads per block of the row kernels; the attention kernel runs 4 warps (``VA_WARPS``).
THREADS = 256
ATTENTION_THREADS = 128
#: Largest head_dim the attention kernel takes (``VA_MAX_D``).
MAX_HEAD_DIM = 128


def padded_head_dim(head_dim: int) -> int | None:
    """The smallest head dim of the core tensor-core attention that holds ``head_dim`` (72 ->
    80), or None past the largest."""
    return next((d for d in FLASH_HEAD_DIMS if d >= head_dim), None)


class VisionCudaOps:
    """The Qwen3-VL vision tower's CUDA ops.

    Args:
        ctx: the cuda backend's op context (:class:`atlas_cuda.context.OpContext`).
    """

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def layer_norm(self, x: Any, weight: Any, bias: Any, eps: float) -> Any:
        """See :func:`atlas_qwen3vl.vision_reference.layer_norm`."""
        rows, cols = x.shape
        out = self.ctx.out(x.shape, x.dtype)
        if rows:
            kernel = self.ctx.kernel("vision", x.dtype, "layer_norm")
            self.ctx.launch(kernel, rows, THREADS, out, x, weight, bias, np.int32(cols),
                            np.float32(eps))
        return out

    def gelu(self, x: Any, approximate: str = "none") -> Any:
        """See :func:`atlas_qwen3vl.vision_reference.gelu`."""
        if approximate not in ("none", "tanh"):
            raise ValueError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
        out = self.ctx.out(x.shape, x.dtype)
        n = int(np.prod(x.shape))
        if n:
            kernel = self.ctx.kernel("vision", x.dtype, "gelu")
            self.ctx.launch(kernel, min(-(-n // THREADS), 8192), THREADS, out, x, np.int64(n),
                            np.int32(approximate == "tanh"))
        return out

    def vision_attention(self, qkv: Any, cos_sin: Any, cu_seqlens: Any, scale: float, *,
                         num_heads: int, head_dim: int) -> Any:
        """See :func:`atlas_qwen3vl.vision_reference.vision_attention`.

        bf16/f16: ``rope_pad`` writes rotated q, k and v zero-padded to :func:`padded_head_dim`,
        the core ``prefill_attention(causal=False)`` runs them on tensor cores, ``unpad_heads``
        drops the padding. float32: the CUDA-core ``vision_attn`` kernel."""
        if head_dim > MAX_HEAD_DIM or head_dim % 2:
            raise ValueError(f"vision_attention: head_dim must be even and at most "
                             f"{MAX_HEAD_DIM} on cuda (got {head_dim})")
        t, width = qkv.shape[0], num_heads * head_dim
        padded = padded_head_dim(head_dim)
        if not t or qkv.dtype == np.float32 or padded is None:
            out = self.ctx.out((t, width), qkv.dtype)
            if t:
                kernel = self.ctx.kernel("vision", qkv.dtype, "vision_attn")
                self.ctx.launch(kernel, (t, num_heads), ATTENTION_THREADS, out, qkv,
                                self.ctx.f32(cos_sin), cu_seqlens,
                                np.int32(cu_seqlens.shape[0] - 1), np.int32(num_heads),
                                np.int32(head_dim), np.float32(scale))
            return out
        # q, k, v: [num_tokens, num_heads, padded]
        q, k, v = (self.ctx.out((t, num_heads, padded), qkv.dtype) for _ in range(3))
        self.ctx.launch(self.ctx.kernel("vision", qkv.dtype, "rope_pad"), t, THREADS, q, k, v,
                        qkv, self.ctx.f32(cos_sin), np.int32(num_heads), np.int32(head_dim),
                        np.int32(padded))
        attn = self.ctx.ops.prefill_attention(q, k, v, cu_seqlens, scale, causal=False)
        if padded == head_dim:
            return attn.reshape(t, width)
        out = self.ctx.out((t, width), qkv.dtype)
        n = t * width
        self.ctx.launch(self.ctx.kernel("vision", qkv.dtype, "unpad_heads"),
                        min(-(-n // THREADS), 8192), THREADS, out, attn, np.int64(n),
                        np.int32(head_dim), np.int32(padded))
        return out

    def interpolate_pos_embed(self, table: Any, indices: Any, weights: Any) -> Any:
        """See :func:`atlas_qwen3vl.vision_reference.interpolate_pos_embed`."""
        n, hidden = indices.shape[0], table.shape[1]
        out = self.ctx.out((n, hidden), table.dtype)
        if n:
            kernel = self.ctx.kernel("vision", table.dtype, "interp_pos")
            self.ctx.launch(kernel, n, THREADS, out, table, indices, self.ctx.f32(weights),
                            np.int32(hidden))
        return out
