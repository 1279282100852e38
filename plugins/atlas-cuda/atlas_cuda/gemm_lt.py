"""cuBLASLt matmuls for large M (prefill, big decode batches) through nvmath-python's bindings.

Optional: installed with ``pip install atlas-cuda[cublas]``. Without nvmath-python, or with
``ATLAS_CUDA_GEMM=mma``, :class:`atlas_cuda.ops.DenseOps` keeps its own mma.sync GEMM.

Everything a call needs is made once per shape outside capture (descriptors, the heuristic's
algorithm) and the workspace is one allocation made at start-up, so a call only enqueues work
and can be recorded into a CUDA graph.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from atlas_cuda.array import DeviceArray
from atlas_cuda.driver import DeviceAllocation

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

    def _attr(self, setter: Any, obj: int, attr: Any, value: Any, dtype: Any) -> None:
        buf = np.array([value], dtype=dtype)
        setter(obj, attr, buf.ctypes.data, buf.nbytes)

    def plan(self, M: int, N: int, K: int, dtype: Any, has_bias: bool, align: int) -> Any:
        """Descriptors and the heuristic's best algorithm for one shape (cached); None if none."""
        key = (M, N, K, np.dtype(dtype).name, has_bias, align)
        if key in self.plans:
            return self.plans[key]
        lt = self.lt
        dt = _CUDA_R[np.dtype(dtype).name]
        desc = lt.matmul_desc_create(_COMPUTE_32F, _SCALE_32F)
        attrs = lt.MatmulDescAttribute
        self._attr(lt.matmul_desc_set_attribute, desc, attrs.TRANSA, _OP_T, np.int32)
        self._attr(lt.matmul_desc_set_attribute, desc, attrs.TRANSB, _OP_N, np.int32)
        if has_bias:
            self._attr(lt.matmul_desc_set_attribute, desc, attrs.EPILOGUE,
                       int(lt.Epilogue.BIAS), np.uint32)
        a = lt.matrix_layout_create(dt, K, N, K)
        b = lt.matrix_layout_create(dt, K, M, K)
        c = lt.matrix_layout_create(dt, N, M, N)
        pref = lt.matmul_preference_create()
        pattr = lt.MatmulPreferenceAttribute
        self._attr(lt.matmul_preference_set_attribute, pref, pattr.MAX_WORKSPACE_BYTES,
                   WORKSPACE_BYTES, np.uint64)
        for which in ("A", "B", "C", "D"):
            self._attr(lt.matmul_preference_set_attribute, pref,
                       getattr(pattr, f"MIN_ALIGNMENT_{which}_BYTES"), align, np.uint32)
        heur = lt.MatmulHeuristicResult(1)
        count = np.zeros(1, np.int32)
        lt.matmul_algo_get_heuristic(self.handle, desc, a, b, c, c, pref, 1, heur.ptr,
                                     count.ctypes.data)
        lt.matmul_preference_destroy(pref)
        plan = None
        if count[0] > 0 and int(heur.state) == 0 and int(heur.workspace_size) <= WORKSPACE_BYTES:
            plan = (desc, a, b, c, heur)
        else:
            log.info("cuBLASLt has no algorithm for M=%d N=%d K=%d; using the mma kernel", M, N, K)
        self.plans[key] = plan
        return plan

    def __call__(self, y: DeviceArray, x: DeviceArray, weight: DeviceArray,
                 bias: DeviceArray | None, M: int, N: int, K: int) -> bool:
        """Enqueue the matmul on the stream; False when cuBLASLt has no algorithm for it."""
        ptrs = [y.ptr, x.ptr, weight.ptr] + ([bias.ptr] if bias is not None else [])
        align = 256 if all(p % 256 == 0 for p in ptrs) else 16
        plan = self.plan(M, N, K, x.dtype, bias is not None, align)
        if plan is None:
            return False
        desc, a, b, c, heur = plan
        lt = self.lt
        if bias is not None:
            self._attr(lt.matmul_desc_set_attribute, desc, lt.MatmulDescAttribute.BIAS_POINTER,
                       bias.ptr, np.int64)
        lt.matmul(self.handle, desc, self.alpha.ctypes.data, weight.ptr, a, x.ptr, b,
                  self.beta.ctypes.data, y.ptr, c, y.ptr, c, heur.ptr, self.workspace.ptr,
                  WORKSPACE_BYTES, self.stream)
        return True

    def close(self) -> None:
        """Free the descriptors and the handle (the workspace goes with this object)."""
        lt = self.lt
        for plan in self.plans.values():
            if plan is not None:
                desc, a, b, c, _ = plan
                for layout in (a, b, c):
                    lt.matrix_layout_destroy(layout)
                lt.matmul_desc_destroy(desc)
        self.plans.clear()
        if self.handle:
            lt.destroy(self.handle)
            self.handle = 0
