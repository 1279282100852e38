"""Gated DeltaNet ops on the cuda backend (``cuda/kernels/gdn.cu``, ``delta_rule.cu`` and
``gdn_chunked.cu`` of this package), registered as the ``cuda`` implementations by
:mod:`atlas_qwen35.plugin` and bound to the backend's :class:`~atlas_cuda.context.OpContext`.

Same signatures and semantics as :mod:`atlas_qwen35.gdn_reference`: state pools are float32,
updated in place; ``state_indices[b] < 0`` marks a padding row whose state is neither read nor
written; a sequence whose ``seq_lens[b]`` equals its query count starts from a zero state.
Needs atlas-cuda (``pip install atlas-qwen35[cuda]``); imported only when a cuda backend builds
its op table.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_cuda.array import DeviceArray
from atlas_cuda.driver import DeviceAllocation
from atlas_qwen35.gdn_reference import compose_gdn_decode

#: Longest depthwise conv kernel the conv1d kernels keep in registers.
CONV_KMAX = 8
#: Channels per block of the prefill conv (must match CONV_CHANNELS in gdn.cu).
CONV_CHANNELS = 64
#: Threads per block of the delta-rule kernel and state rows each thread keeps in registers.
DELTA_THREADS, DELTA_ROWS = 128, 32
#: Threads per block of gdn_decode_split, float4 state rows per thread (DS_ROWS in
#: delta_rule.cu), value columns per block it tries (a cluster holds at most 8 blocks).
SPLIT_THREADS, SPLIT_ROWS, SPLIT_COLS, SPLIT_MAX_CLUSTER = 128, 8, (32, 16, 64), 8
#: Sequences per step up to which policy ``gdn_decode=auto`` takes gdn_decode_split (H200,
#: Qwen3.5-35B heads, scripts/gdn_decode_paths.py, us per layer head -> split: 1 sequence
#: 10.2 -> 7.9, 2: 10.3 -> 8.5, 8: 18.6 -> 20.5).
SPLIT_MAX_SEQS = 2
#: Chunk length, key head size, threads and state columns per block of gdn_chunked.cu.
GC_CHUNK, GC_DK, GC_THREADS, GC_COLS = 64, 128, 256, 16
#: Tokens from which policy ``gdn_prefill=auto`` takes the chunked kernels.
GDN_CHUNKED_MIN_TOKENS = 64
_PREP_SHMEM = 4 * (2 * GC_CHUNK * (GC_DK + 1) + GC_CHUNK * (GC_CHUNK + 1) + 2 * GC_CHUNK)
_SCAN_SHMEM = 4 * (2 * GC_CHUNK * (GC_DK + 4) + GC_CHUNK * (GC_CHUNK + 4) + GC_DK * GC_COLS
                   + GC_CHUNK * GC_COLS)


def _need_f32_pool(name: str, pool: DeviceArray) -> None:
    if pool.dtype != np.float32:
        raise TypeError(f"{name}: the cuda backend keeps recurrent state in float32 pools, "
                        f"got {pool.dtype}; declare the RecurrentStateSpec with dtype float32")


def _need_same_dtype(name: str, x: DeviceArray, *others: DeviceArray | None) -> None:
    for o in others:
        if o is not None and o.dtype != x.dtype:
            raise TypeError(f"{name}: expected every array in {x.dtype}, got {o.dtype}")


def _activation_flag(name: str, activation: str | None) -> int:
    if activation not in (None, "silu"):
        raise ValueError(f"{name}: unsupported activation {activation!r}; use 'silu' or None")
    return int(activation == "silu")


def _conv_args(name: str, x, weight, bias, conv_states) -> tuple[int, int]:
    dim, k = weight.shape[0], weight.shape[-1]
    _need_f32_pool(name, conv_states)
    _need_same_dtype(name, x, weight, bias)
    if not 1 <= k <= CONV_KMAX:
        raise ValueError(f"{name}: kernel size {k} is outside 1..{CONV_KMAX} on the cuda backend")
    if x.shape[-1] != dim or conv_states.shape[1:] != (k - 1, dim):
        raise ValueError(f"{name}: x {x.shape}, weight {weight.shape} and conv_states "
                         f"{conv_states.shape} do not agree on [dim, kernel_size]")
    return dim, k


def _lanes(head_k_dim: int) -> int:
    """Threads sharing one state column: a power of two giving each <= DELTA_ROWS rows."""
    lanes = 1
    while lanes * DELTA_ROWS < head_k_dim:
        lanes *= 2
    if lanes > 32:
        raise ValueError(f"gated_delta_rule: head_k_dim {head_k_dim} is above the cuda kernel "
                         f"limit {32 * DELTA_ROWS}")
    return lanes


def _split_cols(head_k_dim: int, head_v_dim: int) -> int | None:
    """Value columns per block of ``gdn_decode_split``, or None where it does not apply."""
    threads = SPLIT_THREADS
    for cols in SPLIT_COLS:
        row_groups = threads // (cols // 4)
        if (head_v_dim % cols == 0 and head_v_dim // cols <= SPLIT_MAX_CLUSTER
                and row_groups * SPLIT_ROWS >= head_k_dim and threads // 32 * cols <= 512):
            return cols
    return None


class GdnOps:
    """The Gated DeltaNet op implementations of one cuda backend.

    Args:
        ctx: the backend's :class:`~atlas_cuda.context.OpContext` (kernels, launch, workspace,
            kernel policy, op table).
    """

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self._gdn_buf: DeviceAllocation | None = None

    def causal_conv1d(self, x: DeviceArray, weight: DeviceArray, bias: DeviceArray | None,
                      conv_states: DeviceArray, cu_seqlens: DeviceArray, seq_lens: DeviceArray,
                      state_indices: DeviceArray, activation: str | None = "silu") -> DeviceArray:
        silu = _activation_flag("causal_conv1d", activation)
        dim, k = _conv_args("causal_conv1d", x, weight, bias, conv_states)
        out = self.ctx.out(x.shape, x.dtype)
        num_seqs = state_indices.shape[0]
        if num_seqs:
            token_lanes = 4 if x.shape[0] > num_seqs else 1
            self.ctx.launch(self.ctx.kernel("gdn", x.dtype, "causal_conv1d"),
                            (-(-dim // CONV_CHANNELS), num_seqs), CONV_CHANNELS * token_lanes,
                            out, x, weight, bias, conv_states, cu_seqlens, seq_lens,
                            state_indices, dim, k, silu)
        return out

    def causal_conv1d_update(self, x: DeviceArray, weight: DeviceArray, bias: DeviceArray | None,
                             conv_states: DeviceArray, seq_lens: DeviceArray,
                             state_indices: DeviceArray,
                             activation: str | None = "silu") -> DeviceArray:
        silu = _activation_flag("causal_conv1d_update", activation)
        dim, k = _conv_args("causal_conv1d_update", x, weight, bias, conv_states)
        out = self.ctx.out(x.shape, x.dtype)
        if x.shape[0]:
            self.ctx.launch(self.ctx.kernel("gdn", x.dtype, "causal_conv1d_update"),
                            (-(-dim // 128), x.shape[0]), 128, out, x, weight, bias,
                            conv_states, seq_lens, state_indices, dim, k, silu)
        return out

    def _delta_rule(self, qkv, g, beta, ssm_states, cu_seqlens, seq_lens, state_indices,
                    num_k_heads, num_v_heads, head_k_dim, head_v_dim, scale, use_qk_l2norm):
        name = "gated_delta_rule"
        _need_f32_pool(name, ssm_states)
        if num_v_heads % num_k_heads:
            raise ValueError(f"{name}: num_v_heads {num_v_heads} is not a multiple of "
                             f"num_k_heads {num_k_heads}")
        width = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
        if qkv.shape[-1] != width:
            raise ValueError(f"{name}: qkv rows have {qkv.shape[-1]} values, the heads "
                             f"give {width}")
        num_tokens, num_seqs = qkv.shape[0], state_indices.shape[0]
        out = self.ctx.out((num_tokens, num_v_heads, head_v_dim), qkv.dtype)
        if not num_tokens or not num_seqs:
            return out
        lanes = _lanes(head_k_dim)
        cols = DELTA_THREADS // lanes
        scale = head_k_dim ** -0.5 if scale is None else scale
        self.ctx.launch(self.ctx.kernel("delta_rule", qkv.dtype, "gated_delta_rule"),
                        (-(-head_v_dim // cols), num_v_heads, num_seqs), DELTA_THREADS,
                        out, qkv, self.ctx.f32(g), self.ctx.f32(beta), ssm_states, cu_seqlens,
                        seq_lens, state_indices, num_k_heads, num_v_heads, head_k_dim,
                        head_v_dim, float(scale), int(use_qk_l2norm), lanes,
                        shmem=16 * head_k_dim)
        return out

    def _chunked_delta_rule(self, qkv, g, beta, ssm_states, cu_seqlens, seq_lens, state_indices,
                            num_k_heads, num_v_heads, head_k_dim, head_v_dim, scale,
                            use_qk_l2norm) -> DeviceArray | None:
        """Launch gdn_chunk_prep then gdn_chunk_scan; None where they do not apply."""
        width = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
        if (head_k_dim != GC_DK or head_v_dim % GC_COLS or head_v_dim > GC_DK
                or ssm_states.dtype != np.float32 or num_v_heads % num_k_heads
                or qkv.shape[-1] != width):
            return None
        num_tokens, num_seqs = qkv.shape[0], state_indices.shape[0]
        scratch = self._gdn_scratch(num_tokens, num_v_heads, head_v_dim)
        if scratch is None or not num_tokens or not num_seqs:
            return None
        out = self.ctx.out((num_tokens, num_v_heads, head_v_dim), qkv.dtype)
        scale = head_k_dim ** -0.5 if scale is None else scale
        g, beta = self.ctx.f32(g), self.ctx.f32(beta)
        prep = self.ctx.kernel("gdn_chunked", qkv.dtype, "gdn_chunk_prep", _PREP_SHMEM)
        self.ctx.launch(prep, (num_tokens // GC_CHUNK + num_seqs, num_v_heads), GC_THREADS,
                        *scratch, qkv, g, beta, cu_seqlens, num_seqs, num_k_heads, num_v_heads,
                        head_v_dim, float(scale), int(use_qk_l2norm), shmem=_PREP_SHMEM)
        scan = self.ctx.kernel("gdn_chunked", qkv.dtype, "gdn_chunk_scan", _SCAN_SHMEM)
        self.ctx.launch(scan, (head_v_dim // GC_COLS, num_v_heads, num_seqs), GC_THREADS, out,
                        *scratch, ssm_states, cu_seqlens, seq_lens, state_indices, num_v_heads,
                        head_v_dim, shmem=_SCAN_SHMEM)
        return out

    def _gdn_scratch(self, num_tokens: int, num_v_heads: int,
                     head_v_dim: int) -> list[DeviceArray] | None:
        """Float32 W, U, G Q, (G_C / G) K, decayed Q K^T rows and gamma of the chunked kernels,
        ``[num_tokens, num_v_heads, width]`` each, in one allocation kept across calls (stream
        order makes reuse safe); None when it must grow inside a graph capture."""
        widths = (GC_DK, head_v_dim, GC_DK, GC_DK, GC_CHUNK, 1)
        sizes = [-(-num_tokens * num_v_heads * w * 4 // 256) * 256 for w in widths]
        buf = self._gdn_buf
        if buf is None or buf.nbytes < sum(sizes):
            if self.ctx.backend.capturing:
                return None
            if buf is not None:
                # Earlier layers' kernels may still read the old buffer.
                self.ctx.backend.synchronize()
            self._gdn_buf = buf = None
            buf = self._gdn_buf = DeviceAllocation(sum(sizes))
        views, offset = [], 0
        for w, size in zip(widths, sizes):
            views.append(DeviceArray(buf.ptr + offset, (num_tokens, num_v_heads, w), np.float32,
                                     buf))
            offset += size
        return views

    def gated_delta_rule_recurrent(self, qkv: DeviceArray, g: DeviceArray, beta: DeviceArray,
                                   ssm_states: DeviceArray, cu_seqlens: DeviceArray,
                                   seq_lens: DeviceArray, state_indices: DeviceArray, *,
                                   num_k_heads: int, num_v_heads: int, head_k_dim: int,
                                   head_v_dim: int, scale: float | None = None,
                                   use_qk_l2norm: bool = True) -> DeviceArray:
        return self._delta_rule(qkv, g, beta, ssm_states, cu_seqlens, seq_lens, state_indices,
                                num_k_heads, num_v_heads, head_k_dim, head_v_dim, scale,
                                use_qk_l2norm)

    def gated_delta_rule_chunked(self, qkv: DeviceArray, g: DeviceArray, beta: DeviceArray,
                                 ssm_states: DeviceArray, cu_seqlens: DeviceArray,
                                 seq_lens: DeviceArray, state_indices: DeviceArray, *,
                                 num_k_heads: int, num_v_heads: int, head_k_dim: int,
                                 head_v_dim: int, scale: float | None = None,
                                 use_qk_l2norm: bool = True, chunk_size: int = 64) -> DeviceArray:
        """The chunked WY kernels (``gdn_chunked.cu``, 64-token chunks whatever ``chunk_size``)
        where policy ``gdn_prefill`` picks them and the heads fit (``head_k_dim`` 128,
        ``head_v_dim`` a multiple of 16 up to 128), else the token-sequential kernel."""
        mode = self.ctx.policy.gdn_prefill
        if mode != "sequential" and (mode == "chunked"
                                     or qkv.shape[0] >= GDN_CHUNKED_MIN_TOKENS):
            out = self._chunked_delta_rule(qkv, g, beta, ssm_states, cu_seqlens, seq_lens,
                                           state_indices, num_k_heads, num_v_heads, head_k_dim,
                                           head_v_dim, scale, use_qk_l2norm)
            if out is not None:
                return out
        return self._delta_rule(qkv, g, beta, ssm_states, cu_seqlens, seq_lens, state_indices,
                                num_k_heads, num_v_heads, head_k_dim, head_v_dim, scale,
                                use_qk_l2norm)

    def gated_delta_rule_decode(self, qkv: DeviceArray, z: DeviceArray, ba: DeviceArray,
                                conv_weight: DeviceArray, A_log: DeviceArray,
                                dt_bias: DeviceArray, norm_weight: DeviceArray,
                                conv_states: DeviceArray, ssm_states: DeviceArray,
                                cu_seqlens: DeviceArray, seq_lens: DeviceArray,
                                state_indices: DeviceArray, *, num_k_heads: int,
                                num_v_heads: int, head_k_dim: int, head_v_dim: int,
                                eps: float = 1e-6) -> DeviceArray:
        """Two kernels where they apply, unless policy ``gdn_fused`` is off (then the four
        separate ops of the table): ``gdn_conv_gating``, then the recurrent step + gated norm:
        on sm_90+ for at most :data:`SPLIT_MAX_SEQS` sequences ``gdn_decode_split`` (a thread
        block cluster per value head, see :meth:`_decode_split`), else ``gdn_decode_norm`` (a
        block per value head); policy ``gdn_decode=split|head`` picks one whatever the batch."""
        heads = dict(num_k_heads=num_k_heads, num_v_heads=num_v_heads, head_k_dim=head_k_dim,
                     head_v_dim=head_v_dim)
        threads = head_v_dim * _lanes(head_k_dim)
        policy = self.ctx.policy
        mode = policy.gdn_decode
        split = mode == "split" or (mode == "auto" and qkv.shape[0] <= SPLIT_MAX_SEQS)
        cols = (_split_cols(head_k_dim, head_v_dim) if split and ssm_states.ptr % 16 == 0
                and self.ctx.capability >= (9, 0) else None)
        same = all(a.dtype == qkv.dtype for a in (z, ba, conv_weight, norm_weight))
        if not (policy.gdn_fused and same and A_log.dtype == np.float32
                and dt_bias.dtype == np.float32 and num_v_heads % num_k_heads == 0
                and qkv.shape[0] == state_indices.shape[0]
                and (cols is not None or (threads % 32 == 0 and threads <= 512))):
            return compose_gdn_decode(self.ctx.ops, qkv, z, ba, conv_weight, A_log, dt_bias,
                                      norm_weight, conv_states, ssm_states, cu_seqlens, seq_lens,
                                      state_indices, eps=eps, **heads)
        dim, k = _conv_args("gated_delta_rule_decode", qkv, conv_weight, None, conv_states)
        _need_f32_pool("gated_delta_rule_decode", ssm_states)
        if dim != 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim:
            raise ValueError(f"gated_delta_rule_decode: qkv rows have {dim} values, the heads "
                             f"give {2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim}")
        n = qkv.shape[0]
        out = self.ctx.out((n, num_v_heads, head_v_dim), qkv.dtype)
        if not n:
            return out
        x = self.ctx.out(qkv.shape, qkv.dtype)
        g = self.ctx.out((n, num_v_heads), np.float32)
        beta = self.ctx.out((n, num_v_heads), np.float32)
        launch = self.ctx.launch
        launch(self.ctx.kernel("gdn", qkv.dtype, "gdn_conv_gating"), (-(-dim // 128) + 1, n), 128,
               x, g, beta, qkv, conv_weight, conv_states, seq_lens, state_indices, dim, k, ba,
               A_log, dt_bias, num_v_heads, pdl=self.ctx.pdl)
        if cols is not None:
            self._decode_split(out, x, z, g, beta, ssm_states, seq_lens, state_indices,
                               norm_weight, cols, SPLIT_THREADS, eps, **heads)
            return out
        launch(self.ctx.kernel("delta_rule", qkv.dtype, "gdn_decode_norm"), (num_v_heads, n),
               threads, out, x, z, g, beta, ssm_states, seq_lens, state_indices, norm_weight,
               num_k_heads, num_v_heads, head_k_dim, head_v_dim, float(head_k_dim ** -0.5),
               _lanes(head_k_dim), float(eps), shmem=4 * (2 * head_k_dim + 32), pdl=self.ctx.pdl)
        return out

    def _decode_split(self, out, x, z, g, beta, ssm_states, seq_lens, state_indices, norm_weight,
                      cols, threads, eps, *, num_k_heads, num_v_heads, head_k_dim, head_v_dim):
        """``gdn_decode_split``: grid (head_v_dim / cols, num_v_heads, num_seqs) of ``threads``
        threads, a thread block cluster per (value head, sequence)."""
        self.ctx.launch(self.ctx.kernel("delta_rule", x.dtype, "gdn_decode_split"),
                        (1, num_v_heads, x.shape[0]), threads, out, x, z, g, beta, ssm_states,
                        seq_lens, state_indices, norm_weight, num_k_heads, num_v_heads,
                        head_k_dim, head_v_dim, cols, float(head_k_dim ** -0.5), float(eps),
                        shmem=8 * head_k_dim, pdl=self.ctx.pdl,
                        cluster=(head_v_dim // cols, 1, 1))

    def gdn_gating(self, ba: DeviceArray, A_log: DeviceArray, dt_bias: DeviceArray):
        num_heads = ba.shape[-1] // 2
        rows = ba.size // ba.shape[-1] if ba.shape[-1] else 0
        g = self.ctx.out((rows, num_heads), np.float32)
        beta = self.ctx.out((rows, num_heads), np.float32)
        n = rows * num_heads
        if n:
            self.ctx.launch(self.ctx.kernel("gdn", ba.dtype, "gdn_gating"),
                            min(-(-n // 256), 4096), 256, g, beta, ba, self.ctx.f32(A_log),
                            self.ctx.f32(dt_bias), num_heads, np.int64(n))
        return g, beta

    def rms_norm_gated(self, x: DeviceArray, gate: DeviceArray, weight: DeviceArray,
                       eps: float) -> DeviceArray:
        _need_same_dtype("rms_norm_gated", x, gate)
        d = x.shape[-1]
        rows = x.size // d if d else 0
        out = self.ctx.out(x.shape, x.dtype)
        if not rows:
            return out
        if weight.dtype == x.dtype:
            k = self.ctx.kernel("gdn", x.dtype, "rms_norm_gated")
        else:
            weight = self.ctx.f32(weight)
            k = self.ctx.kernel("gdn", x.dtype, "rms_norm_gated_wf32")
        self.ctx.launch(k, -(-rows // 4), 128, out, x, gate, weight, float(eps), d,
                        np.int64(rows))
        return out
