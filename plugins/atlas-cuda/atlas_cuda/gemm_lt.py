"""cuBLASLt matmuls for large M (prefill, big decode batches) through nvmath-python's bindings.

Optional: installed with ``pip install atlas-cuda[cublas]``. Without nvmath-python, or with
``ATLAS_CUDA_GEMM=mma``, :class:`atlas_cuda.ops.DenseOps` keeps its own mma.sync GEMM.

Everything a call needs is made once per shape outside capture (descriptors, the heuristic's
algorithm, or with policy ``gemm_tune`` the fastest of its candidates: :mod:`atlas_cuda.gemm_tune`)
and the workspace is one allocation made at start-up, so a call only enqueues work and can be
recorded into a CUDA graph.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from atlas_cuda.array import DeviceArray
from atlas_cuda.driver import DeviceAllocation
from atlas_cuda.gemm_tune import (HEURISTIC_DTYPE, TUNE_CANDIDATES, TUNE_MAX_ROWS, Algo,
                                  GemmTimer, pick_fastest, usable)

log = logging.getLogger(__name__)

WORKSPACE_BYTES = 32 << 20
_CUDA_R = {"bfloat16": 14, "float16": 2}
_COMPUTE_32F = 68
_SCALE_32F = 0
_OP_N, _OP_T = 0, 1


class CublasLtUnavailable(RuntimeError):
    """nvmath-python or the cuBLASLt library is missing."""


class CublasLtGemm:
    """``y[M, N] = x[M, K] @ W[N, K]^T (+ bias)`` with bf16/f16 inputs and fp32 accumulation.

    Row-major ``y`` is column-major ``y^T [N, M]``, so cuBLASLt computes ``W^T' x^T`` with
    ``A = W`` (column-major ``K x N``, transposed) and ``B = x`` (column-major ``K x M``).

    Args:
        stream: the backend's ``CUstream`` handle (int).
    """

    def __init__(self, stream: int) -> None:
        try:
            from nvmath.bindings import cublasLt
        except ImportError as exc:
            raise CublasLtUnavailable("nvmath-python is not installed "
                                      "(pip install 'atlas-cuda[cublas]')") from exc
        self.lt = cublasLt
        try:
            self.handle = cublasLt.create()
        except Exception as exc:  # noqa: BLE001 - library missing or no device
            raise CublasLtUnavailable(f"cuBLASLt could not start: {exc}") from exc
        self.stream = int(stream)
        self.workspace = DeviceAllocation(WORKSPACE_BYTES)
        self.alpha = np.ones(1, np.float32)
        self.beta = np.zeros(1, np.float32)
        self.plans: dict[tuple, Any] = {}
        self.descs: dict[tuple, tuple] = {}
        self.tuned: set[tuple] = set()
        self.timer: GemmTimer | None = None

    def _attr(self, setter: Any, obj: int, attr: Any, value: Any, dtype: Any) -> None:
        buf = np.array([value], dtype=dtype)
        setter(obj, attr, buf.ctypes.data, buf.nbytes)

    def plan(self, M: int, N: int, K: int, dtype: Any, has_bias: bool, align: int,
             operands: tuple | None = None) -> Any:
        """Descriptors and an algorithm for one shape (cached); None if cuBLASLt has none.

        The heuristic's first algorithm, or with ``operands`` (``(y, x, weight, bias)`` to time
        on; policy ``gemm_tune``, in a graph's eager probe call only) and at most
        :data:`~atlas_cuda.gemm_tune.TUNE_MAX_ROWS` rows the fastest of its first
        :data:`~atlas_cuda.gemm_tune.TUNE_CANDIDATES` (:mod:`atlas_cuda.gemm_tune`). A shape
        planned untuned is tuned on the first call that asks."""
        key = (M, N, K, np.dtype(dtype).name, has_bias, align)
        tune = operands is not None and M <= TUNE_MAX_ROWS
        if key in self.plans and (not tune or key in self.tuned or self.plans[key] is None):
            return self.plans[key]
        descs = self.descs.get(key)
        if descs is None:
            descs = self.descs[key] = self._descriptors(M, N, K, dtype, has_bias)
        desc, a, b, c = descs
        lt = self.lt
        pref = lt.matmul_preference_create()
        pattr = lt.MatmulPreferenceAttribute
        self._attr(lt.matmul_preference_set_attribute, pref, pattr.MAX_WORKSPACE_BYTES,
                   WORKSPACE_BYTES, np.uint64)
        for which in ("A", "B", "C", "D"):
            self._attr(lt.matmul_preference_set_attribute, pref,
                       getattr(pattr, f"MIN_ALIGNMENT_{which}_BYTES"), align, np.uint32)
        results = np.zeros(TUNE_CANDIDATES if tune else 1, HEURISTIC_DTYPE)
        count = np.zeros(1, np.int32)
        lt.matmul_algo_get_heuristic(self.handle, desc, a, b, c, c, pref, len(results),
                                     results.ctypes.data, count.ctypes.data)
        lt.matmul_preference_destroy(pref)
        ok = usable(results, int(count[0]), WORKSPACE_BYTES)
        plan = None
        if not ok:
            log.info("cuBLASLt has no algorithm for M=%d N=%d K=%d; using the mma kernel", M, N, K)
        elif tune and len(ok) > 1:
            plan = (desc, a, b, c, self._fastest(descs, results, ok, operands, (M, N, K)))
        else:
            plan = (desc, a, b, c, Algo(results, ok[0]))
        if tune:
            self.tuned.add(key)
        self.plans[key] = plan
        return plan

    def _descriptors(self, M: int, N: int, K: int, dtype: Any, has_bias: bool) -> tuple:
        lt = self.lt
        dt = _CUDA_R[np.dtype(dtype).name]
        desc = lt.matmul_desc_create(_COMPUTE_32F, _SCALE_32F)
        attrs = lt.MatmulDescAttribute
        self._attr(lt.matmul_desc_set_attribute, desc, attrs.TRANSA, _OP_T, np.int32)
        self._attr(lt.matmul_desc_set_attribute, desc, attrs.TRANSB, _OP_N, np.int32)
        if has_bias:
            self._attr(lt.matmul_desc_set_attribute, desc, attrs.EPILOGUE,
                       int(lt.Epilogue.BIAS), np.uint32)
        return (desc, lt.matrix_layout_create(dt, K, N, K), lt.matrix_layout_create(dt, K, M, K),
                lt.matrix_layout_create(dt, N, M, N))

    def _fastest(self, descs: tuple, results: np.ndarray, ok: list[int], operands: tuple,
                 shape: tuple) -> Algo:
        """Time each usable candidate on ``operands``; the fastest (a candidate that fails to
        launch is skipped; the heuristic's first where all fail)."""
        if self.timer is None:
            self.timer = GemmTimer(self.stream)
        times: list[float | None] = []
        for i in ok:
            algo = Algo(results, i)
            try:
                times.append(self.timer.median_ms(
                    lambda: self._enqueue(descs, algo, *operands)))
            except Exception as exc:  # noqa: BLE001 - an algorithm the device refuses
                log.debug("gemm_tune: candidate %d of M=%d N=%d K=%d failed: %s", i, *shape, exc)
                times.append(None)
        best = pick_fastest(times)
        best = 0 if best is None else best
        log.debug("gemm_tune M=%d N=%d K=%d: candidate %d of %d (%s ms; heuristic's first %s)",
                  *shape, ok[best], len(ok), times[best], times[0])
        return Algo(results, ok[best])

    def _enqueue(self, descs: tuple, algo: Algo, y: DeviceArray, x: DeviceArray,
                 weight: DeviceArray, bias: DeviceArray | None) -> None:
        desc, a, b, c = descs
        lt = self.lt
        if bias is not None:
            self._attr(lt.matmul_desc_set_attribute, desc, lt.MatmulDescAttribute.BIAS_POINTER,
                       bias.ptr, np.int64)
        lt.matmul(self.handle, desc, self.alpha.ctypes.data, weight.ptr, a, x.ptr, b,
                  self.beta.ctypes.data, y.ptr, c, y.ptr, c, algo.ptr, self.workspace.ptr,
                  WORKSPACE_BYTES, self.stream)

    def __call__(self, y: DeviceArray, x: DeviceArray, weight: DeviceArray,
                 bias: DeviceArray | None, M: int, N: int, K: int, tune: bool = False) -> bool:
        """Enqueue the matmul on the stream; False when cuBLASLt has no algorithm for it.
        ``tune``: plan an untuned shape by timing (policy ``gemm_tune``; the caller passes it
        only in a graph's eager probe call)."""
        ptrs = [y.ptr, x.ptr, weight.ptr] + ([bias.ptr] if bias is not None else [])
        align = 256 if all(p % 256 == 0 for p in ptrs) else 16
        plan = self.plan(M, N, K, x.dtype, bias is not None, align,
                         (y, x, weight, bias) if tune else None)
        if plan is None:
            return False
        self._enqueue(plan[:4], plan[4], y, x, weight, bias)
        return True

    def close(self) -> None:
        """Free the descriptors and the handle (the workspace goes with this object)."""
        lt = self.lt
        for desc, a, b, c in self.descs.values():
            for layout in (a, b, c):
                lt.matrix_layout_destroy(layout)
            lt.matmul_desc_destroy(desc)
        self.descs.clear()
        self.plans.clear()
        self.tuned.clear()
        if self.timer is not None:
            self.timer.close()
            self.timer = None
        if self.handle:
            lt.destroy(self.handle)
            self.handle = 0
