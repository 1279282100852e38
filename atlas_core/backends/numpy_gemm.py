"""Batch-invariant float32 matmul for the numpy backend (``linear``, MoE experts).

BLAS gives a row of ``x @ w.T`` different rounding depending on how many rows share the call
and where the row sits in it (GEMV for one row, GEMM tiles and edge kernels, small-matrix paths,
thread partitioning): measured with OpenBLAS 0.3.31, a row's float32 result changed with the
number of rows for most row counts. A token's activations then depend on what else runs in its
step, and bf16 rounding turns that into different logits. Here every output element is one dot
product over ``K`` computed by the same loop, whose order depends on ``K`` alone, so a row's
result is the same bits whatever ``M`` is and wherever the row sits.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency
    numba = None


def _dot_tiles(x, w, out):
    # x: [M, K], w: [N, K], out: [M, N], all float32 C-contiguous. Tiles of 2 rows x 4 columns;
    # edge tiles repeat their last row / column (clamped indices) so every element goes through
    # the same vectorised loop, with the same summation order.
    m, k_size = x.shape
    n = w.shape[0]
    for j0 in range(0, n, 4):
        j1, j2, j3 = min(j0 + 1, n - 1), min(j0 + 2, n - 1), min(j0 + 3, n - 1)
        for i0 in range(0, m, 2):
            i1 = min(i0 + 1, m - 1)
            s0 = s1 = s2 = s3 = t0 = t1 = t2 = t3 = np.float32(0.0)
            for k in range(k_size):
                a, b = x[i0, k], x[i1, k]
                w0, w1, w2, w3 = w[j0, k], w[j1, k], w[j2, k], w[j3, k]
                s0 += a * w0
                s1 += a * w1
                s2 += a * w2
                s3 += a * w3
                t0 += b * w0
                t1 += b * w1
                t2 += b * w2
                t3 += b * w3
            out[i0, j0], out[i0, j1], out[i0, j2], out[i0, j3] = s0, s1, s2, s3
            out[i1, j0], out[i1, j1], out[i1, j2], out[i1, j3] = t0, t1, t2, t3


_dot_tiles_jit = (numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})(_dot_tiles)
                  if numba is not None else None)


#: Multiply-adds above which a matmul is split over threads (the kernel releases the GIL).
_PARALLEL_MIN_MACS = 1 << 24
_pool: ThreadPoolExecutor | None = None


def _workers() -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(cpus or 1, 16)


def _run_split(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    # Split rows (or, for few rows, output columns) over threads. Every piece runs the same
    # compiled kernel on C-contiguous arrays, so no element's arithmetic changes.
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(_workers(), thread_name_prefix="atlas-numpy-gemm")
    parts = _workers()
    m, n = out.shape
    if m >= 4 * parts:
        bounds = np.linspace(0, m, parts + 1).astype(int) // 2 * 2
        bounds[-1] = m
        jobs = [(x[a:b], w, out[a:b]) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        list(_pool.map(lambda job: _dot_tiles_jit(*job), jobs))
        return
    bounds = np.linspace(0, n, parts + 1).astype(int) // 4 * 4
    bounds[-1] = n
    pieces = [(a, b, np.empty((m, b - a), np.float32)) for a, b in zip(bounds[:-1], bounds[1:])
              if b > a]
    list(_pool.map(lambda p: _dot_tiles_jit(x, w[p[0]:p[1]], p[2]), pieces))
    for a, b, piece in pieces:
        out[:, a:b] = piece


def matmul_nt(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x @ w.T`` in float32 where each row's result does not depend on the other rows.

    Large products are split over a thread pool (rows, or output columns for few rows); the
    split changes no bits.

    Args:
        x: ``[M, K]`` float32.
        w: ``[N, K]`` float32 (the HF linear layout).

    Returns:
        ``[M, N]`` float32.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    w = np.ascontiguousarray(w, dtype=np.float32)
    out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    if not x.shape[0] or not w.shape[0]:
        return out
    if _dot_tiles_jit is not None:
        if _workers() > 1 and x.shape[0] * x.shape[1] * w.shape[0] >= _PARALLEL_MIN_MACS:
            _run_split(x, w, out)
        else:
            _dot_tiles_jit(x, w, out)
        return out
    wt = w.T
    for i in range(x.shape[0]):
        out[i] = x[i] @ wt
    return out


def linear_f32(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """:func:`matmul_nt` over the last axis of ``x`` (``[..., K]`` -> ``[..., N]``)."""
    lead = x.shape[:-1]
    return matmul_nt(x.reshape(-1, x.shape[-1]), w).reshape(*lead, w.shape[0])
