"""Mamba-2 ops on the cuda backend (``cuda/kernels/mamba2.cu`` and ``mamba2_decode.cu`` of this
package), registered as the ``cuda`` implementations by :mod:`atlas_nemotron_h.plugin` and bound to
the backend's op context (``ctx.kernel`` compiles through the NVRTC disk cache, ``ctx.out`` takes
outputs from the step workspace, ``ctx.launch`` launches on the backend's stream).

Same signatures and semantics as :mod:`atlas_nemotron_h.mamba2_reference`: state pools are
float32, updated in place. Every launch takes device arrays and scalars only (no host sync),
so decode steps capture into CUDA graphs. ``mamba2_ssd_chunked`` runs the recurrence token by
token (as the numpy backend does): a sequence's state is the same however its prompt was split.
Prefill steps can run it with the time loop in staged chunks instead (``mamba2_scan_chunked``,
:data:`SCAN_KERNEL_ENV` ``chunked``), the same state update; not the default: on an H200 the
nemotron-3-nano shape's 1,024-token TTFT was 434.6 ms with it against 406.7 ms token by token
(batch 8: 3,445.7 against 3,231.0 ms; prefill time is elsewhere, see docs/benchmarks.md).
Needs atlas-cuda (``pip install atlas-nemotron-h[cuda]``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from atlas_nemotron_h.mamba2_reference import compose_mamba2_decode

#: Longest depthwise conv kernel the conv kernels keep in registers (M2_KMAX in mamba2.cu).
CONV_KMAX = 8
#: Threads per block of the conv kernels.
CONV_THREADS = 128
#: Warps per block of the scan (M2_WARPS), and the largest state size a warp keeps in registers.
SCAN_WARPS, SCAN_MAX_STATE = 4, 256
#: Threads per block of the gated norm.
NORM_THREADS = 128
#: The fused decode kernel (``mamba2_decode_*``): warps a block, conv channels a thread, largest
#: conv kernel (M2D_WARPS, M2D_CONV, M2D_KF), blocks a cluster (the portable most); its builds
#: as (channels a warp, state columns a lane): 8 x 4, 8 x 8 and 16 x 4.
DECODE_WARPS, DECODE_CONV, DECODE_KF, DECODE_CLUSTER = 8, 2, 4, 8
DECODE_BUILDS = ((8, 4), (8, 8), (16, 4))
#: Environment variable choosing the decode step: ``auto`` (default: the fused kernel while its
#: blocks are at most one an SM, :func:`fused_fits`), ``fused`` (one kernel, see
#: :meth:`Mamba2CudaOps.mamba2_decode`) or ``ops`` (the conv, scan and gated-norm kernels).
DECODE_KERNEL_ENV = "ATLAS_MAMBA2_DECODE"
#: Environment variable choosing the prefill scan kernel: ``token`` (default; the token-by-token
#: kernel, which decode steps always run) or ``chunked`` (the time loop in staged chunks of up
#: to 32 tokens; measured slower, see the module docstring).
SCAN_KERNEL_ENV = "ATLAS_MAMBA2_SCAN"


def scan_kernel() -> str:
    """The prefill scan kernel :data:`SCAN_KERNEL_ENV` selects (read per call, so tests and
    benches can switch it): both give the same state bit for bit, ``y`` up to the order of its
    float32 sum over the state columns."""
    kind = os.environ.get(SCAN_KERNEL_ENV, "token")
    if kind not in ("chunked", "token"):
        raise ValueError(f"{SCAN_KERNEL_ENV}={kind!r}: use 'chunked' or 'token'")
    return kind


def decode_kernel() -> str:
    """The decode step :data:`DECODE_KERNEL_ENV` selects (read per call)."""
    kind = os.environ.get(DECODE_KERNEL_ENV, "auto")
    if kind not in ("auto", "fused", "ops"):
        raise ValueError(f"{DECODE_KERNEL_ENV}={kind!r}: use 'auto', 'fused' or 'ops'")
    return kind


def fused_fits(num_seqs: int, num_heads: int, hpb: int, num_sms: int) -> bool:
    """Whether the fused decode kernel pays: its blocks (``num_heads / hpb`` a sequence) at
    most one an SM. Each block walks its heads' whole state, a latency chain (state loads,
    conv, scan, cluster barrier, norm, state stores) that the three separate kernels' far more
    and smaller blocks hide better once SMs hold several blocks (H200, nemotron-3-nano at
    1,024 tokens, a step against the three kernels in the same call: batch 1 2.67 / 2.75 ms,
    batch 2 3.97 / 4.03, batch 4 (two blocks an SM) 5.94 / 5.86; batch 8 in another call
    9.69 / 9.55)."""
    return num_seqs * (num_heads // hpb) <= num_sms


def decode_plan(num_heads: int, head_dim: int, n_groups: int,
                state_size: int) -> tuple[int, int, int] | None:
    """``(heads a block, channels a warp, state columns a lane)`` of the fused decode kernel:
    the fewest heads that split a group into at most :data:`DECODE_CLUSTER` blocks, with the
    block's channels within one of :data:`DECODE_BUILDS` and its conv channels within its
    threads; None when nothing fits (the separate kernels run then)."""
    if num_heads % n_groups:
        return None
    per_group = num_heads // n_groups
    for hpb in range(1, per_group + 1):
        if per_group % hpb or per_group // hpb > DECODE_CLUSTER:
            continue
        channels = hpb * head_dim
        if channels + 2 * state_size > DECODE_CONV * 32 * DECODE_WARPS:
            continue
        for cpw, spl in DECODE_BUILDS:
            if channels <= DECODE_WARPS * cpw and state_size <= 32 * spl:
                return hpb, cpw, spl
    return None


def _need_f32_pool(name: str, pool: Any) -> None:
    if pool.dtype != np.float32:
        raise TypeError(f"{name}: the cuda backend keeps Mamba-2 state in float32 pools, got "
                        f"{pool.dtype}; declare the RecurrentStateSpec with dtype float32")


def _silu_flag(name: str, activation: str | None) -> int:
    if activation not in (None, "silu"):
        raise ValueError(f"{name}: unsupported activation {activation!r}; use 'silu' or None")
    return int(activation == "silu")


def _conv_sizes(name: str, x: Any, weight: Any, bias: Any, conv_states: Any) -> tuple[int, int]:
    dim, k = weight.shape[0], weight.shape[-1]
    _need_f32_pool(name, conv_states)
    if not 1 <= k <= CONV_KMAX:
        raise ValueError(f"{name}: conv kernel {k} is outside 1..{CONV_KMAX} on the cuda backend")
    if any(a is not None and a.dtype != x.dtype for a in (weight, bias)):
        raise TypeError(f"{name}: conv weight and bias must be in the activation dtype {x.dtype}")
    if x.shape[-1] != dim or tuple(conv_states.shape[1:]) != (k - 1, dim):
        raise ValueError(f"{name}: x {x.shape}, weight {weight.shape} and conv_states "
                         f"{conv_states.shape} do not agree on [dim, kernel_size]")
    return dim, k


class Mamba2CudaOps:
    """The Nemotron-H family's CUDA ops.

    Args:
        ctx: the cuda backend's op context (:class:`atlas_cuda.context.OpContext`).
    """

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def mamba2_conv1d(self, x: Any, weight: Any, bias: Any, conv_states: Any, cu_seqlens: Any,
                      seq_lens: Any, state_indices: Any, activation: str | None = "silu") -> Any:
        """See :func:`atlas_nemotron_h.mamba2_reference.mamba2_conv1d`."""
        silu = _silu_flag("mamba2_conv1d", activation)
        dim, k = _conv_sizes("mamba2_conv1d", x, weight, bias, conv_states)
        out = self.ctx.out(x.shape, x.dtype)
        num_seqs = state_indices.shape[0]
        if num_seqs:
            self.ctx.launch(self.ctx.kernel("mamba2", x.dtype, "mamba2_conv1d"),
                            (-(-dim // CONV_THREADS), num_seqs), CONV_THREADS, out, x, weight,
                            bias, conv_states, cu_seqlens, seq_lens, state_indices, dim, k, silu)
        return out

    def mamba2_conv1d_update(self, x: Any, weight: Any, bias: Any, conv_states: Any,
                             seq_lens: Any, state_indices: Any,
                             activation: str | None = "silu") -> Any:
        """See :func:`atlas_nemotron_h.mamba2_reference.mamba2_conv1d_update`."""
        silu = _silu_flag("mamba2_conv1d_update", activation)
        dim, k = _conv_sizes("mamba2_conv1d_update", x, weight, bias, conv_states)
        out = self.ctx.out(x.shape, x.dtype)
        if x.shape[0]:
            self.ctx.launch(self.ctx.kernel("mamba2", x.dtype, "mamba2_conv1d_update"),
                            (-(-dim // CONV_THREADS), x.shape[0]), CONV_THREADS, out, x, weight,
                            bias, conv_states, seq_lens, state_indices, dim, k, silu)
        return out

    def _scan(self, xbc, dt, A_log, dt_bias, D, ssm_states, cu_seqlens, seq_lens,
              state_indices, num_heads, head_dim, n_groups, state_size, dt_min, dt_max):
        name = "mamba2_ssd"
        _need_f32_pool(name, ssm_states)
        if state_size > SCAN_MAX_STATE or num_heads % n_groups:
            raise ValueError(f"{name}: state_size {state_size} above {SCAN_MAX_STATE}, or "
                             f"num_heads {num_heads} not a multiple of n_groups {n_groups}")
        width = num_heads * head_dim + 2 * n_groups * state_size
        if xbc.shape[-1] != width or dt.dtype != xbc.dtype:
            raise ValueError(f"{name}: xbc rows have {xbc.shape[-1]} values (the sizes give "
                             f"{width}); dt must be in {xbc.dtype}, got {dt.dtype}")
        num_tokens, num_seqs = xbc.shape[0], state_indices.shape[0]
        out = self.ctx.out((num_tokens, num_heads * head_dim), xbc.dtype)
        if num_tokens and num_seqs:
            ctx = self.ctx
            chunked = num_tokens > num_seqs and scan_kernel() == "chunked"
            kernel = "mamba2_scan_chunked" if chunked else "mamba2_scan"
            ctx.launch(ctx.kernel("mamba2", xbc.dtype, kernel),
                       (-(-head_dim // SCAN_WARPS), num_heads, num_seqs), 32 * SCAN_WARPS, out,
                       xbc, dt, ctx.f32(A_log), ctx.f32(dt_bias), ctx.f32(D), ssm_states,
                       cu_seqlens, seq_lens, state_indices, num_heads, head_dim, n_groups,
                       state_size, float(dt_min), float(dt_max))
        return out

    def mamba2_ssd_recurrent(self, xbc: Any, dt: Any, A_log: Any, dt_bias: Any, D: Any,
                             ssm_states: Any, cu_seqlens: Any, seq_lens: Any,
                             state_indices: Any, *, num_heads: int, head_dim: int, n_groups: int,
                             state_size: int, dt_min: float = 0.0,
                             dt_max: float = float("inf")) -> Any:
        """See :func:`atlas_nemotron_h.mamba2_reference.mamba2_ssd_recurrent`."""
        return self._scan(xbc, dt, A_log, dt_bias, D, ssm_states, cu_seqlens, seq_lens,
                          state_indices, num_heads, head_dim, n_groups, state_size, dt_min,
                          dt_max)

    def mamba2_ssd_chunked(self, xbc: Any, dt: Any, A_log: Any, dt_bias: Any, D: Any,
                           ssm_states: Any, cu_seqlens: Any, seq_lens: Any, state_indices: Any,
                           *, num_heads: int, head_dim: int, n_groups: int, state_size: int,
                           dt_min: float = 0.0, dt_max: float = float("inf"),
                           chunk_size: int = 128) -> Any:
        """See :func:`atlas_nemotron_h.mamba2_reference.mamba2_ssd_chunked` (run token by
        token; ``chunk_size`` does not apply)."""
        return self._scan(xbc, dt, A_log, dt_bias, D, ssm_states, cu_seqlens, seq_lens,
                          state_indices, num_heads, head_dim, n_groups, state_size, dt_min,
                          dt_max)

    def mamba2_decode(self, xbc: Any, z: Any, dt: Any, conv_weight: Any, conv_bias: Any,
                      A_log: Any, dt_bias: Any, D: Any, norm_weight: Any, conv_states: Any,
                      ssm_states: Any, cu_seqlens: Any, seq_lens: Any, state_indices: Any, *,
                      num_heads: int, head_dim: int, n_groups: int, state_size: int,
                      dt_min: float = 0.0, dt_max: float = float("inf"),
                      eps: float = 1e-5) -> Any:
        """See :func:`atlas_nemotron_h.mamba2_reference.mamba2_decode`: one launch on sm_90+
        (``mamba2_decode_*``: conv update, state update and gated norm, a thread block cluster
        per group and sequence; PDL, the state rows loaded before the wait) while its blocks are
        at most one an SM (:func:`fused_fits`; :data:`DECODE_KERNEL_ENV` ``fused`` always, ``ops``
        never), else the three kernels of the separate ops."""
        sizes = dict(num_heads=num_heads, head_dim=head_dim, n_groups=n_groups,
                     state_size=state_size, dt_min=dt_min, dt_max=dt_max)
        ctx = self.ctx
        plan = decode_plan(num_heads, head_dim, n_groups, state_size)
        k = conv_weight.shape[-1]
        n = xbc.shape[0]
        same = all(a is None or a.dtype == xbc.dtype for a in (z, dt, conv_weight, conv_bias))
        kind = decode_kernel()
        if (plan is None or kind == "ops" or ctx.capability < (9, 0) or not same
                or not 1 <= k <= DECODE_KF or n != state_indices.shape[0]
                or norm_weight.dtype not in (xbc.dtype, np.float32)
                or (kind == "auto" and not fused_fits(n, num_heads, plan[0], ctx.num_sms))):
            return compose_mamba2_decode(ctx.ops, xbc, z, dt, conv_weight, conv_bias, A_log,
                                         dt_bias, D, norm_weight, conv_states, ssm_states,
                                         cu_seqlens, seq_lens, state_indices, eps=eps, **sizes)
        dim, k = _conv_sizes("mamba2_decode", xbc, conv_weight, conv_bias, conv_states)
        _need_f32_pool("mamba2_decode", ssm_states)
        inner = num_heads * head_dim
        if dim != inner + 2 * n_groups * state_size or z.shape[-1] != inner:
            raise ValueError(f"mamba2_decode: xbc rows have {dim} values and z {z.shape[-1]}; "
                             f"the sizes give {inner + 2 * n_groups * state_size} and {inner}")
        out = ctx.out((n, inner), xbc.dtype)
        if not n:
            return out
        hpb, cpw, spl = plan
        wf32 = "wf32_" if norm_weight.dtype != xbc.dtype else ""
        channels = hpb * head_dim + 2 * state_size
        name = f"mamba2_decode_{wf32}c{cpw}s{spl}"
        ctx.launch(ctx.kernel("mamba2_decode", xbc.dtype, name),
                   (n_groups, n), 32 * DECODE_WARPS, out, xbc, z, dt, conv_weight, conv_bias,
                   ctx.f32(A_log), ctx.f32(dt_bias), ctx.f32(D), norm_weight, conv_states,
                   ssm_states, seq_lens, state_indices, num_heads, head_dim, n_groups,
                   state_size, k, hpb, float(dt_min), float(dt_max), float(eps),
                   shmem=4 * channels, pdl=ctx.pdl,
                   cluster=(num_heads // n_groups // hpb, 1, 1))
        return out

    def mamba2_gated_norm(self, y: Any, z: Any, weight: Any, group_size: int, eps: float) -> Any:
        """See :func:`atlas_nemotron_h.mamba2_reference.mamba2_gated_norm`."""
        if z.dtype != y.dtype or y.shape != z.shape or y.shape[-1] % group_size:
            raise ValueError(f"mamba2_gated_norm: y {y.shape} {y.dtype} and z {z.shape} "
                             f"{z.dtype} must match, the width a multiple of {group_size}")
        d = y.shape[-1]
        rows = y.size // d if d else 0
        out = self.ctx.out(y.shape, y.dtype)
        if rows:
            name = "mamba2_gated_norm" if weight.dtype == y.dtype else "mamba2_gated_norm_wf32"
            weight = weight if weight.dtype == y.dtype else self.ctx.f32(weight)
            self.ctx.launch(self.ctx.kernel("mamba2", y.dtype, name), (d // group_size, rows),
                            NORM_THREADS, out, y, z, weight, d, group_size, float(eps))
        return out

    def relu2(self, x: Any) -> Any:
        """See :func:`atlas_nemotron_h.ffn_reference.relu2`."""
        out = self.ctx.out(x.shape, x.dtype)
        if x.size:
            self.ctx.launch(self.ctx.kernel("mamba2", x.dtype, "relu2"),
                            min(-(-x.size // 256), 8192), 256, out, x, np.int64(x.size))
        return out
