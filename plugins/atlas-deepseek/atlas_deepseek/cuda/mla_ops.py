"""The MLA ops and ``moe_route_grouped`` on the cuda backend: launches of ``mla.cu``,
``mla_attention.cu``, ``mla_decode_keys2.cu``, ``mla_decode_keys.cu``, ``mla_decode_mma.cu``
and ``moe_route_grouped.cu``.

Absorbed decode steps in bf16 / f16 on sm_80+ take a tensor-core kernel where one exists for
the latent shape and shared memory holds it (:mod:`atlas_deepseek.cuda.mla_decode_plan`:
``mla_decode_keys2.cu``'s two-blocks-an-SM layout at Mistral-Small-4's 256 + 64,
``mla_decode_mma.cu`` for DeepSeek-V3 / Kimi-K2; ``ATLAS_MLA_DECODE`` = ``keys2`` / ``keys1`` /
``v1`` picks another for A/B runs).
The SIMT split kernel stays the fallback (and runs everything under policy ``attention=simt``,
``ATLAS_CUDA_ATTENTION=simt``).

The cuda backend builds one :class:`MlaCudaOps` per backend with its op context (``ctx.kernel``
compiles through the NVRTC disk cache, ``ctx.out`` takes outputs from the step workspace,
``ctx.launch`` launches on the backend's stream). Every launch reads only device arrays and
host scalars, so decode steps capture into CUDA graphs.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from atlas_deepseek.cuda.mla_decode_plan import DecodePlan, decode_plan, decode_splits
from atlas_deepseek.routing import SCORING

LOG2E = 1.4426950408889634

#: Widest latent the register-held kernels take (``MLA_MAX_RANK`` in mla.cu).
MAX_RANK = 1024
#: Warps of ``mla_absorbed_attention`` (``MLA_WARPS``) and the query-token tile of
#: ``mla_absorb_query`` (``ABSORB_TILE``).
WARPS, TILE = 4, 8
#: The split decode kernel: heads per block (two per warp), rows staged per tile, widest
#: latent and row (``DEC_*`` in mla.cu), most context splits.
DEC_HEADS, DEC_TILE, DEC_MAX_RANK, DEC_MAX_W, MAX_SPLITS = 16, 16, 512, 576, 32
#: Widest value head of ``mla_expanded_attention`` (``EXP_MAX_V``).
EXP_MAX_V = 256
#: Most splits ``mla_decode_combine`` merges (``COMB_MAX_SPLITS``) and its latent columns a
#: block (``COMB_COLS``) and threads (``COMB_THREADS``) in mla_attention.cu.
COMBINE_MAX_SPLITS, COMBINE_COLS, COMBINE_THREADS = 256, 128, 256


class MlaCudaOps:
    """The DeepSeek family's CUDA ops.

    Args:
        ctx: the cuda backend's op context (:class:`atlas_cuda.context.OpContext`).
    """

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def _same_dtype(self, name: str, *arrays: Any) -> None:
        dtypes = {np.dtype(a.dtype).name for a in arrays}
        if len(dtypes) > 1:
            raise TypeError(f"{name}: the cuda kernel takes one dtype for activations, weights "
                            f"and the latent cache (got {sorted(dtypes)}); use --kv-cache-dtype "
                            "auto with MLA models")

    def mla_latent_cache(self, kv_a: Any, norm_weight: Any, eps: float, positions: Any,
                         cos_sin_cache: Any, cache: Any, slot_mapping: Any, *, kv_lora_rank: int,
                         is_neox: bool = True) -> None:
        """See :func:`atlas_deepseek.mla_reference.mla_latent_cache`."""
        self._same_dtype("mla_latent_cache", kv_a, norm_weight, cache)
        t, width = kv_a.shape
        if t:
            kernel = self.ctx.kernel("mla", kv_a.dtype, "mla_latent_cache")
            self.ctx.launch(kernel, t, 128, cache, kv_a, norm_weight, positions, cos_sin_cache,
                            slot_mapping, np.int32(kv_lora_rank), np.int32(width - kv_lora_rank),
                            np.float32(eps), np.int32(int(is_neox)))

    def mla_rope_query(self, q: Any, positions: Any, cos_sin_cache: Any, *, nope_dim: int,
                       is_neox: bool = True, attn_scale_beta: float = 0.0,
                       attn_scale_original: int = 1) -> tuple[Any, Any]:
        """See :func:`atlas_deepseek.mla_reference.mla_rope_query`."""
        t, heads, width = q.shape
        rope = width - nope_dim
        q_nope = self.ctx.out((t, heads, nope_dim), q.dtype)
        q_pe = self.ctx.out((t, heads, rope), q.dtype)
        if t:
            kernel = self.ctx.kernel("mla", q.dtype, "mla_rope_query")
            self.ctx.launch(kernel, (t, heads), 64, q_nope, q_pe, q, positions, cos_sin_cache,
                            np.int32(heads), np.int32(nope_dim), np.int32(rope),
                            np.int32(int(is_neox)), np.float32(attn_scale_beta),
                            np.int32(max(1, attn_scale_original)))
        return q_nope, q_pe

    def _head_dims(self, name: str, x: Any, kv_b_weight: Any) -> tuple[int, int]:
        heads = x.shape[1]
        rank = kv_b_weight.shape[1]
        if rank > MAX_RANK or kv_b_weight.shape[0] % heads:
            raise ValueError(f"{name}: kv_b_proj {tuple(kv_b_weight.shape)} does not fit "
                             f"{heads} heads of a latent <= {MAX_RANK} on cuda")
        self._same_dtype(name, x, kv_b_weight)
        return kv_b_weight.shape[0] // heads, rank

    def mla_absorb_query(self, q_nope: Any, kv_b_weight: Any) -> Any:
        """See :func:`atlas_deepseek.mla_reference.mla_absorb_query`."""
        t, heads, nope = q_nope.shape
        per_head, rank = self._head_dims("mla_absorb_query", q_nope, kv_b_weight)
        out = self.ctx.out((t, heads, rank), q_nope.dtype)
        if t:
            kernel = self.ctx.kernel("mla", q_nope.dtype, "mla_absorb_query")
            self.ctx.launch(kernel, (heads, -(-rank // 128)), 128, out, q_nope, kv_b_weight,
                            np.int32(t), np.int32(heads), np.int32(nope),
                            np.int32(per_head - nope), np.int32(rank), shmem=TILE * nope * 4)
        return out

    def mla_absorb_output(self, o_lat: Any, kv_b_weight: Any, v_head_dim: int) -> Any:
        """See :func:`atlas_deepseek.mla_reference.mla_absorb_output`."""
        t, heads, rank = o_lat.shape
        per_head, _ = self._head_dims("mla_absorb_output", o_lat, kv_b_weight)
        out = self.ctx.out((t, heads, v_head_dim), o_lat.dtype)
        if t:
            kernel = self.ctx.kernel("mla", o_lat.dtype, "mla_absorb_output")
            self.ctx.launch(kernel, (heads, -(-v_head_dim // 8)), 256, out, o_lat, kv_b_weight,
                            np.int32(t), np.int32(heads), np.int32(per_head - v_head_dim),
                            np.int32(v_head_dim), np.int32(rank))
        return out

    def mla_absorbed_attention(self, q_lat: Any, q_pe: Any, cache: Any, block_tables: Any,
                               seq_lens: Any, cu_seqlens_q: Any, scale: float) -> Any:
        """See :func:`atlas_deepseek.mla_reference.mla_absorbed_attention`."""
        t, heads, rank = q_lat.shape
        rope = q_pe.shape[-1]
        if rank > MAX_RANK or cache.shape[-1] != rank + rope:
            raise ValueError(f"mla_absorbed_attention: latent {rank} + rope {rope} does not "
                             f"match the cache rows ({cache.shape[-1]}) or exceeds {MAX_RANK}")
        self._same_dtype("mla_absorbed_attention", q_lat, q_pe, cache)
        if t and t == seq_lens.shape[0]:
            plan = self._mma_plan(q_lat, rope)
            if plan is not None:
                return self._decode_mma(plan, q_lat, q_pe, cache, block_tables, seq_lens, scale)
            if rank <= DEC_MAX_RANK and rank + rope <= DEC_MAX_W:
                return self._decode_split(q_lat, q_pe, cache, block_tables, seq_lens, scale)
        out = self.ctx.out((t, heads, rank), q_lat.dtype)
        if t:
            kernel = self.ctx.kernel("mla_attention", q_lat.dtype, "mla_absorbed_attention")
            shmem = (rank + rope + WARPS * (rank + 2)) * 4
            self.ctx.launch(kernel, (t, heads), 32 * WARPS, out, q_lat, q_pe, cache,
                            block_tables, seq_lens, cu_seqlens_q,
                            np.int32(seq_lens.shape[0]), np.int32(heads), np.int32(rank),
                            np.int32(rope), np.int32(block_tables.shape[1]),
                            np.int32(cache.shape[1]), np.float32(scale), shmem=shmem)
        return out

    def decode_kernel(self, q_lat: Any, q_pe: Any) -> str:
        """The kernel that decode rows of these shapes take (``mla_decode_keys2_r<rank>``,
        ``mla_decode_keys2x2_r<rank>``, ``mla_decode_keys_r<rank>`` or ``mla_decode_mma_r<rank>``
        on tensor cores, else ``mla_decode_split`` or, for latents past its widths,
        ``mla_absorbed_attention``): for benchmarks and logs."""
        rank, rope = q_lat.shape[-1], q_pe.shape[-1]
        plan = self._mma_plan(q_lat, rope)
        if plan is not None:
            return f"{plan.config.kernel}_r{rank} ({plan.stages} stages)"
        if rank <= DEC_MAX_RANK and rank + rope <= DEC_MAX_W:
            return "mla_decode_split"
        return "mla_absorbed_attention"

    def _smem_optin(self) -> int:
        """The device's opt-in shared memory per block (bytes; 0 where unknown: the context's
        ``smem_optin``)."""
        return int(getattr(self.ctx, "smem_optin", 0) or 0)

    def _mma_plan(self, q_lat: Any, rope: int) -> DecodePlan | None:
        """The tensor-core decode kernel for these shapes (:func:`decode_plan`, first choice
        ``ATLAS_MLA_DECODE``), or None where none applies: policy ``attention=simt``, a float32
        model, pre-sm_80, a latent shape without a kernel, or too little shared memory for two
        stages (then the SIMT split kernel runs)."""
        if (self.ctx.policy.attention == "simt"
                or np.dtype(q_lat.dtype).name not in ("bfloat16", "float16")
                or tuple(self.ctx.capability) < (8, 0)):
            return None
        return decode_plan(q_lat.shape[-1], rope, self._smem_optin(),
                           os.environ.get("ATLAS_MLA_DECODE", ""))

    def _decode_mma(self, plan: DecodePlan, q_lat: Any, q_pe: Any, cache: Any,
                    block_tables: Any, seq_lens: Any, scale: float) -> Any:
        """Decode rows on tensor cores (any kernel of :mod:`.mla_decode_plan`: same arguments
        and partials), merged by ``mla_decode_combine``. The context splits make one wave of
        blocks (:func:`decode_splits`); shapes only decide the split count, so captured graphs
        keep it."""
        config = plan.config
        batch, heads, rank = q_lat.shape
        groups = -(-heads // config.heads)
        max_ctx = block_tables.shape[1] * cache.shape[1]
        splits = decode_splits(plan, batch, groups, self.ctx.num_sms, max_ctx)
        part_o = self.ctx.out((batch * splits * heads * rank,), np.float32)
        part_ml = self.ctx.out((batch * splits * heads * 2,), np.float32)
        kernel = self.ctx.kernel(config.module, q_lat.dtype, f"{config.kernel}_r{rank}",
                                 max_shmem=plan.shmem)
        self.ctx.launch(kernel, (batch, groups, splits), 32 * config.warps, part_o, part_ml,
                        q_lat, q_pe, cache, block_tables, seq_lens, np.int32(heads),
                        np.int32(block_tables.shape[1]), np.int32(cache.shape[1]),
                        np.float32(scale * LOG2E), np.int32(splits), np.int32(plan.stages),
                        shmem=plan.shmem)
        return self._combine(part_o, part_ml, batch, heads, rank, splits, q_lat.dtype)

    def _combine(self, part_o: Any, part_ml: Any, batch: int, heads: int, rank: int,
                 splits: int, dtype: Any) -> Any:
        """Merge the split partials of any decode kernel into ``[batch, heads, rank]``: a block
        per (sequence, head, ``COMBINE_COLS`` latent columns), its threads over the splits."""
        if splits > COMBINE_MAX_SPLITS:
            raise ValueError(f"mla_decode_combine: {splits} splits > {COMBINE_MAX_SPLITS}")
        out = self.ctx.out((batch, heads, rank), dtype)
        combine = self.ctx.kernel("mla_attention", dtype, "mla_decode_combine")
        self.ctx.launch(combine, (batch, heads, -(-rank // COMBINE_COLS)), COMBINE_THREADS, out,
                        part_o, part_ml, np.int32(heads), np.int32(rank), np.int32(splits))
        return out

    def _decode_split(self, q_lat: Any, q_pe: Any, cache: Any, block_tables: Any,
                      seq_lens: Any, scale: float) -> Any:
        """Decode rows (one query per sequence, the last position): the context split over
        enough blocks to fill the GPU, then merged. The split count depends on shapes only, so
        a captured graph keeps it; each block splits the actual length it reads on the device."""
        batch, heads, rank = q_lat.shape
        rope = q_pe.shape[-1]
        groups = -(-heads // DEC_HEADS)
        splits = max(1, min(MAX_SPLITS, -(-2 * self.ctx.num_sms // (batch * groups))))
        part_o = self.ctx.out((batch * splits * heads * rank,), np.float32)
        part_ml = self.ctx.out((batch * splits * heads * 2,), np.float32)
        shmem = DEC_TILE * (rank + rope) * np.dtype(cache.dtype).itemsize
        split = self.ctx.kernel("mla_attention", q_lat.dtype, "mla_decode_split")
        self.ctx.launch(split, (batch, groups, splits), 32 * DEC_HEADS // 2, part_o, part_ml,
                        q_lat, q_pe, cache, block_tables, seq_lens, np.int32(heads),
                        np.int32(rank), np.int32(rope), np.int32(block_tables.shape[1]),
                        np.int32(cache.shape[1]), np.float32(scale), np.int32(splits),
                        shmem=shmem)
        return self._combine(part_o, part_ml, batch, heads, rank, splits, q_lat.dtype)

    def mla_gather_latent(self, cache: Any, block_tables: Any, seq_lens: Any,
                          num_ctx_tokens: int, kv_lora_rank: int) -> tuple[Any, Any]:
        """See :func:`atlas_deepseek.mla_reference.mla_gather_latent`."""
        rope = cache.shape[-1] - kv_lora_rank
        c = self.ctx.out((num_ctx_tokens, kv_lora_rank), cache.dtype)
        k_pe = self.ctx.out((num_ctx_tokens, rope), cache.dtype)
        if num_ctx_tokens:
            kernel = self.ctx.kernel("mla", cache.dtype, "mla_gather_latent")
            self.ctx.launch(kernel, num_ctx_tokens, 128, c, k_pe, cache, block_tables, seq_lens,
                            np.int32(seq_lens.shape[0]), np.int32(kv_lora_rank), np.int32(rope),
                            np.int32(block_tables.shape[1]), np.int32(cache.shape[1]))
        return c, k_pe

    def mla_expanded_attention(self, q_nope: Any, q_pe: Any, kv: Any, k_pe: Any, seq_lens: Any,
                               cu_seqlens_q: Any, scale: float) -> Any:
        """See :func:`atlas_deepseek.mla_reference.mla_expanded_attention`."""
        t, heads, nope = q_nope.shape
        rope, v = q_pe.shape[-1], kv.shape[-1] - nope
        if v > EXP_MAX_V:
            raise ValueError(f"mla_expanded_attention: v_head_dim {v} > {EXP_MAX_V} on cuda")
        self._same_dtype("mla_expanded_attention", q_nope, q_pe, kv, k_pe)
        out = self.ctx.out((t, heads, v), q_nope.dtype)
        if t:
            kernel = self.ctx.kernel("mla_attention", q_nope.dtype, "mla_expanded_attention")
            shmem = (nope + rope + WARPS * (v + 2)) * 4
            self.ctx.launch(kernel, (t, heads), 32 * WARPS, out, q_nope, q_pe, kv, k_pe,
                            seq_lens, cu_seqlens_q, np.int32(seq_lens.shape[0]),
                            np.int32(heads), np.int32(nope), np.int32(rope), np.int32(v),
                            np.float32(scale), shmem=shmem)
        return out

    def moe_route_grouped(self, router_logits: Any, correction_bias: Any, top_k: int,
                          num_groups: int, topk_groups: int, scoring: str = "sigmoid",
                          renormalize: bool = True,
                          routed_scaling_factor: float = 1.0) -> tuple[Any, Any]:
        """See :func:`atlas_deepseek.routing.moe_route_grouped`."""
        t, e = router_logits.shape
        if scoring not in SCORING:
            raise ValueError(f"moe_route_grouped: scoring must be one of {SCORING}")
        if e > 1024 or num_groups > 32 or not 0 < top_k <= min(32, e):
            raise ValueError(f"moe_route_grouped: at most 1024 experts, 32 groups and top_k "
                             f"1..32 on cuda (got {e} experts, {num_groups} groups, top_k {top_k})")
        bias = None if correction_bias is None else self.ctx.f32(correction_bias)
        weights = self.ctx.out((t, top_k), np.float32)
        ids = self.ctx.out((t, top_k), np.int32)
        if t:
            kernel = self.ctx.kernel("moe_route_grouped", router_logits.dtype, "moe_route_grouped")
            self.ctx.launch(kernel, -(-t // 128), 128, weights, ids, router_logits, bias,
                            np.int32(t), np.int32(e), np.int32(top_k), np.int32(num_groups),
                            np.int32(topk_groups), np.int32(int(scoring == "softmax")),
                            np.int32(int(renormalize)), np.float32(routed_scaling_factor))
        return weights, ids
