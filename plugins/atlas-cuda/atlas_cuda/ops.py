"""CudaOps: every op of :mod:`atlas_core.ops` as NVRTC kernels (same signatures as the references)."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from atlas_cuda import env as cuda_env
from atlas_cuda.array import DeviceArray
from atlas_cuda.kernels_loader import variant_of
from atlas_cuda.ops_attention import AttentionOps
from atlas_cuda.ops_gdn import GdnOps
from atlas_cuda.ops_gemv import GEMV_MAX_M, GemvOps
from atlas_cuda.ops_guided import GuidedOps
from atlas_cuda.ops_moe import MoeOps
from atlas_cuda.ops_sampling import SamplingOps

log = logging.getLogger(__name__)

#: (max M, BM, BN, threads, stages) of the tensor-core GEMM tiles, smallest first.
GEMM_TILES = ((32, 32, 64, 128, 4), (128, 64, 128, 256, 3), (1 << 62, 128, 128, 256, 3))


def _need_vec(name: str, *arrays: DeviceArray, last: int | None = None) -> None:
    for a in arrays:
        if a is not None and a.ptr % 16:
            raise ValueError(f"{name}: device array at 0x{a.ptr:x} is not 16-byte aligned")
    if last is not None and last % 8:
        raise ValueError(f"{name}: last dimension {last} must be a multiple of 8 on the cuda backend")


def _threads(n: int, cap: int) -> int:
    """``n`` rounded up to whole warps, between 32 and ``cap``."""
    return min(cap, max(32, -(-n // 32) * 32))


class CudaOps(AttentionOps, SamplingOps, GdnOps, GuidedOps, GemvOps, MoeOps):
    """Op wrappers; outputs come from the backend's step workspace."""

    def __init__(self, backend: Any) -> None:
        self.be = backend
        self._lt: Any = None
        self._pdl = cuda_env.pdl_enabled() and tuple(backend.capability) >= (9, 0)
        #: rope and decode attention also launched with PDL (they wait before reading)
        self._pdl_chain = self._pdl and cuda_env.pdl_chain()

    def _cublaslt(self) -> Any:
        """The cuBLASLt GEMM (created on first use, never under capture), or None."""
        if self._lt is None:
            self._lt = False
            mode = cuda_env.gemm_mode()
            if mode != "mma":
                from atlas_cuda.gemm_lt import CublasLtGemm, CublasLtUnavailable
                try:
                    self._lt = CublasLtGemm(self.be.stream)
                except CublasLtUnavailable as exc:
                    if mode == "cublaslt":
                        raise
                    log.info("%s; large matmuls use the mma.sync kernel", exc)
        return self._lt or None

    def _k(self, module: str, dtype: Any, name: str, max_shmem: int = 0) -> Any:
        if dtype is None:
            return self.be.kernels.kernel(module, "any", name, max_shmem)
        v = variant_of(dtype)
        return self.be.kernels.kernel(module, v, f"{name}_{v}", max_shmem)

    def _launch(self, kernel: Any, grid: Any, block: Any, *args: Any, shmem: int = 0,
                pdl: bool = False) -> None:
        self.be.kernels.launch(kernel, grid, block, *args, shmem=shmem, pdl=pdl)

    def _out(self, shape: Any, dtype: Any) -> DeviceArray:
        return self.be.workspace.alloc(tuple(shape), dtype)

    def embedding(self, ids: DeviceArray, table: DeviceArray) -> DeviceArray:
        hidden = table.shape[-1]
        out = self._out((*ids.shape, hidden), table.dtype)
        if ids.size:
            vec = hidden % 8 == 0 and table.ptr % 16 == 0 and table.dtype.itemsize <= 4
            name = "embedding" if vec else "embedding_scalar"
            threads = _threads(-(-hidden // 8) if vec else hidden, 256)
            self._launch(self._k("elementwise", table.dtype, name), ids.size, threads,
                         out, ids, table, hidden)
        return out

    def rms_norm(self, x: DeviceArray, weight: DeviceArray, eps: float,
                 residual: DeviceArray | None = None, *, zero_centered: bool = False):
        hidden = x.shape[-1]
        _need_vec("rms_norm", x, weight, residual, last=hidden)
        if hidden > 512 * 32:
            raise ValueError(f"rms_norm: hidden size {hidden} is above the kernel limit 16384")
        y = self._out(x.shape, x.dtype)
        r = self._out(x.shape, x.dtype) if residual is not None else None
        rows = x.size // hidden
        threads = _threads(-(-hidden // 32), 512)
        if rows:
            self._launch(self._k("elementwise", x.dtype, "rms_norm"), rows, threads, y, r, x,
                         residual, weight, float(eps), hidden, int(zero_centered))
        return (y, r) if residual is not None else y

    def linear(self, x: DeviceArray, weight: DeviceArray, bias: DeviceArray | None = None):
        K, N = x.shape[-1], weight.shape[0]
        M = x.size // K if K else 0
        y = self._out((*x.shape[:-1], N), x.dtype)
        if M == 0:
            return y
        v = variant_of(x.dtype)
        if K % 8 or x.ptr % 16 or weight.ptr % 16:
            self._launch(self._k("linear", x.dtype, "linear_scalar"), -(-M * N // 8), 256,
                         y, x, weight, bias, M, N, K)
            return y
        if M <= GEMV_MAX_M or v == "f32":
            self._gemv(y, x, weight, bias, M, N, K)
            return y
        lt = self._cublaslt()
        if lt is not None and lt(y, x, weight, bias, M, N, K):
            return y
        _, bm, bn, threads, stages = next(t for t in GEMM_TILES if M <= t[0])
        shmem = stages * (bm + bn) * 40 * x.dtype.itemsize
        k = self.be.kernels.kernel("linear", v, f"gemm_{v}_{bm}x{bn}", shmem)
        self._launch(k, (-(-N // bn), -(-M // bm)), threads, y, x, weight, bias, M, N, K,
                     shmem=shmem)
        return y

    def add(self, a: DeviceArray, b: DeviceArray) -> DeviceArray:
        if a.size != b.size:
            raise ValueError(f"add: sizes differ ({a.shape} vs {b.shape})")
        out = self._out(a.shape, a.dtype)
        if a.dtype == b.dtype:
            k = self._k("elementwise", a.dtype, "add")
        elif a.dtype == np.float32:
            k = self._k("elementwise", b.dtype, "add_f32")
        else:
            raise TypeError(f"add: unsupported dtype pair {a.dtype} + {b.dtype}")
        if a.size:
            self._launch(k, min(-(-a.size // 256), 8192), 256, out, a, b, np.int64(a.size))
        return out

    def _act_and_mul(self, x: DeviceArray, name: str) -> DeviceArray:
        d = x.shape[-1] // 2
        rows = x.size // (2 * d) if d else 0
        out = self._out((*x.shape[:-1], d), x.dtype)
        if rows and (d % 8 or x.ptr % 16):
            self._launch(self._k("elementwise", x.dtype, f"{name}_scalar"),
                         min(-(-out.size // 256), 8192), 256, out, x, d, np.int64(out.size))
        elif rows:
            self._launch(self._k("elementwise", x.dtype, name), (-(-d // 1024), rows), 128,
                         out, x, d)
        return out

    def silu_and_mul(self, x: DeviceArray) -> DeviceArray:
        return self._act_and_mul(x, "silu_and_mul")

    def gelu_tanh_and_mul(self, x: DeviceArray) -> DeviceArray:
        return self._act_and_mul(x, "gelu_tanh_and_mul")

    def moe_route(self, router_logits: DeviceArray, top_k: int, renormalize: bool,
                  scoring: str = "softmax"):
        if scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"unsupported MoE scoring {scoring!r}; use softmax or sigmoid")
        t, e = router_logits.shape
        if e > 1024 or not 0 < top_k <= min(32, e):
            raise ValueError(f"moe_route: at most 1024 experts and top_k between 1 and "
                             f"min(32, experts) on cuda (got {e} experts, top_k {top_k})")
        w, ids = self._out((t, top_k), np.float32), self._out((t, top_k), np.int32)
        if t:
            pl = 4 if e <= 128 else 8 if e <= 256 else 32
            self._launch(self._k("moe", router_logits.dtype, f"moe_route_w{pl}"), -(-t // 4), 128,
                         w, ids, router_logits, t, e, top_k, int(renormalize),
                         int(scoring == "sigmoid"), pdl=self._pdl)
        return w, ids

    def moe_experts(self, x: DeviceArray, w_gate_up: DeviceArray, w_down: DeviceArray,
                    topk_weights: DeviceArray, topk_ids: DeviceArray,
                    activation: str = "silu") -> DeviceArray:
        t, hidden = x.shape
        inter, k = w_down.shape[-1], topk_ids.shape[-1]
        _need_vec("moe_experts", x, w_gate_up, w_down, last=math.gcd(hidden, inter))
        gelu = int(activation in ("gelu_tanh", "gelu_pytorch_tanh"))
        if not t:
            return self._out(x.shape, x.dtype)
        if not self._moe_grouped(t * k, w_down.shape[0], x.dtype):
            # per-pair GEMVs: moe_decode.cu's expert kernels without a shared expert
            return self._moe_decode_experts(x, w_gate_up, w_down, topk_weights, topk_ids, None,
                                            None, None, gelu)
        out = self._out(x.shape, x.dtype)
        self._moe_grouped_experts(out, x, w_gate_up, w_down, topk_weights, topk_ids, gelu)
        return out

    def _moe_grouped(self, pairs: int, experts: int, dtype: Any) -> bool:
        """Grouped GEMM once the pairs average two per expert (bf16/f16 only): below that the
        per-pair GEMV streams the weights faster (H200: 35B-A3B shape, 32 tokens, 0.39 ms GEMV
        against 0.48 ms grouped; 30B-A3B, 32 tokens: 0.57 against 0.47)."""
        mode = cuda_env.moe_mode()
        if variant_of(dtype) == "f32" or mode == "gemv" or experts > 1024:
            return False
        return mode == "grouped" or pairs >= 2 * experts

    def _moe_grouped_experts(self, out: DeviceArray, x: DeviceArray, w_gate_up: DeviceArray,
                             w_down: DeviceArray, topk_weights: DeviceArray,
                             topk_ids: DeviceArray, gelu: int) -> None:
        """Pairs sorted by expert into tiles of ``bm`` rows (static sizes: graph-capturable);
        one tensor-core tile per (expert tile, column tile) for gate_up and for down."""
        t, hidden = x.shape
        experts, inter, k = w_down.shape[0], w_down.shape[-1], topk_ids.shape[-1]
        pairs = t * k
        bm = 64 if pairs >= 32 * min(experts, pairs) else 16
        tiles = -(-pairs // bm) + min(experts, pairs)
        sorted_ids = self._out((tiles * bm,), np.int32)
        tile_expert = self._out((tiles,), np.int32)
        self._launch(self._k("moe", x.dtype, "moe_align"), 1, 1024, sorted_ids, tile_expert,
                     topk_ids, pairs, experts, bm, tiles)
        v = variant_of(x.dtype)
        threads = 128 if bm == 16 else 256
        shmem = (4 if bm == 16 else 3) * (bm + 128) * 40 * x.dtype.itemsize
        h = self._out((pairs, inter), x.dtype)
        kern = self.be.kernels.kernel("moe", v, f"moe_gemm_gate_up_{v}_{bm}", shmem)
        self._launch(kern, (-(-inter // 64), tiles), threads, h, x, w_gate_up, sorted_ids,
                     tile_expert, k, inter, hidden, gelu, shmem=shmem)
        y = self._out((pairs, hidden), x.dtype)
        kern = self.be.kernels.kernel("moe", v, f"moe_gemm_down_{v}_{bm}", shmem)
        self._launch(kern, (-(-hidden // 128), tiles), threads, y, h, w_down, sorted_ids,
                     tile_expert, hidden, inter, shmem=shmem)
        self._launch(self._k("moe", x.dtype, "moe_combine"), (-(-hidden // 2048), t), 256,
                     out, y, topk_weights, k, hidden)
