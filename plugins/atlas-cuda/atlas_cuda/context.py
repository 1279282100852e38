"""OpContext: the backend handles every CUDA op module takes explicitly.

The op modules (:mod:`atlas_cuda.ops`, ``ops_attention``, ``ops_gemv``, ``ops_moe``,
``ops_sampling``, ``ops_guided``, and plugins' own CUDA op modules) are classes constructed with
one :class:`OpContext`; they read what they need from it (``ctx.kernel``, ``ctx.launch``,
``ctx.out``, ``ctx.policy``…) instead of attributes of a shared final class. The context is
built once per backend; only :attr:`OpContext.workspace` changes afterwards (graph capture swaps
in the graph's private arena), so ops must read it through the context on every call.

Convention for an op class: ``__init__(self, ctx)`` keeps ``ctx`` (and may cache derived
constants); its public methods carry the reference ops' names and signatures, so the op table
holds ``getattr(ctx.bind(cls), name)`` — plain bound methods, no wrapper per call. Policy values
are read as ``self.ctx.policy.<field>`` (attribute lookups; never the environment).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from atlas_cuda.array import DeviceArray
from atlas_cuda.kernels_loader import KernelLibrary, variant_of
from atlas_cuda.memory import Workspace, require_eager
from atlas_cuda.policy import KernelPolicy

log = logging.getLogger(__name__)

#: Completion counters per kernel kind (attention: token x head chunk; sampling: row).
COUNTERS = 4096


def need_vec(name: str, *arrays: DeviceArray | None, last: int | None = None) -> None:
    """Refuse operands the vectorised kernels cannot take: a device array not 16-byte aligned,
    or a last dimension (``last``) not a multiple of 8."""
    for a in arrays:
        if a is not None and a.ptr % 16:
            raise ValueError(f"{name}: device array at 0x{a.ptr:x} is not 16-byte aligned")
    if last is not None and last % 8:
        raise ValueError(f"{name}: last dimension {last} must be a multiple of 8 on the cuda "
                         "backend")


class OpContext:
    """Backend handles of the CUDA op modules.

    Attributes:
        backend: the owning :class:`~atlas_cuda.backend.CudaBackend` (allocations outside the
            workspace: ``backend.zeros`` / ``backend.empty`` / ``backend.copy_``).
        stream: the cuda.core stream every op launches on.
        stream_handle: its raw ``CUstream`` handle (an int).
        kernels: the target's :class:`~atlas_cuda.kernels_loader.KernelLibrary`.
        launch: ``kernels.launch``, bound once (``launch(kernel, grid, block, *args, shmem=,
            pdl=, cluster=)``).
        workspace: the current step arena (swapped by graph capture).
        policy: the frozen :class:`~atlas_cuda.policy.KernelPolicy` of this backend.
        capability: the device's ``(major, minor)`` compute capability.
        num_sms: streaming multiprocessors of the device.
        l2_bytes: the device's L2 cache size.
        smem_optin: the device's opt-in shared memory a block (0: unknown; :meth:`fits_smem`).
        pdl: launch the decode kernels with programmatic dependent launch (policy on and
            sm_90+); each waits before reading what the previous kernel wrote.
        ops: the backend's assembled op table, for unfused fallbacks (``compose_*``) that call
            other ops; set by the backend once the table exists.
    """

    def __init__(self, backend: Any, kernels: KernelLibrary, workspace: Workspace,
                 policy: KernelPolicy) -> None:
        self.backend = backend
        self.stream = backend.stream_obj
        self.stream_handle = backend.stream
        self.kernels = kernels
        self.launch = kernels.launch
        self.workspace = workspace
        self.capability = tuple(backend.capability)
        self.num_sms = backend.num_sms
        self.l2_bytes = backend.l2_bytes
        self.smem_optin = int(getattr(backend, "smem_optin", 0) or 0)
        self.set_policy(policy)
        self.ops: Any = None
        self._lt: Any = None
        self._counters: DeviceArray | None = None
        self._parts: dict[type, Any] = {}

    def set_policy(self, policy: KernelPolicy) -> None:
        """Use ``policy`` from the next op call on (the backend's, once; tests and A/B scripts
        swap it between calls, never while a captured graph holds kernels of the old one)."""
        self.policy = policy
        self.pdl = policy.pdl and self.capability >= (9, 0)

    def fits_smem(self, dynamic: int, static: int = 0) -> bool:
        """Whether a block taking ``dynamic`` bytes of dynamic and ``static`` of static shared
        memory can launch on this device (``smem_optin``: 227 KB on an H100 / H200, 99 KB on a
        GB10; unknown, 0, fits everything). Ops check it before choosing a kernel sized for
        Hopper and take a smaller one where it fails."""
        return not self.smem_optin or dynamic + static <= self.smem_optin

    def bind(self, cls: type) -> Any:
        """The one instance of op class ``cls`` (constructed as ``cls(ctx)``) for this context,
        created on first ask: the table builder binds each implementing class once, and a class
        that calls another's helpers (``MoeOps`` -> ``GemvOps``) shares that same instance."""
        part = self._parts.get(cls)
        if part is None:
            part = self._parts[cls] = cls(self)
        return part

    def kernel(self, module: str, dtype: Any, name: str, max_shmem: int = 0) -> Any:
        """Kernel ``<name>_<variant>`` of ``module`` for ``dtype`` (``None``: the ``any``
        variant and ``name`` as is), compiled and loaded on first use."""
        if dtype is None:
            return self.kernels.kernel(module, "any", name, max_shmem)
        v = variant_of(dtype)
        return self.kernels.kernel(module, v, f"{name}_{v}", max_shmem)

    def out(self, shape: Any, dtype: Any) -> DeviceArray:
        """An op output of ``shape`` / ``dtype`` from the current step workspace."""
        return self.workspace.alloc(tuple(shape), dtype)

    def f32(self, x: DeviceArray) -> DeviceArray:
        """``x`` widened to float32 (``x`` itself when it already is)."""
        if x.dtype == np.float32:
            return x
        out = self.workspace.alloc(tuple(x.shape), np.float32)
        if x.size:
            self.launch(self.kernel("elementwise", x.dtype, "to_f32"),
                        min(-(-x.size // 256), 8192), 256, out, x, np.int64(x.size), pdl=self.pdl)
        return out

    def sync_counters(self) -> DeviceArray:
        """Zeroed int32 completion counters (``2 * COUNTERS``: attention, then sampling) of
        the last-block-done kernels (each kernel leaves them at zero); allocated once, outside
        graph capture."""
        if self._counters is None:
            require_eager(self.backend, "attention/sample")
            self._counters = self.backend.zeros((2 * COUNTERS,), np.int32)
        return self._counters

    def cublaslt(self) -> Any:
        """The cuBLASLt GEMM (created on first use, never under capture), or None where the
        policy says ``mma`` or nvmath-python is missing (``gemm=cublaslt`` then raises)."""
        if self._lt is None:
            self._lt = False
            mode = self.policy.gemm
            if mode != "mma":
                from atlas_cuda.gemm_lt import CublasLtGemm, CublasLtUnavailable
                try:
                    self._lt = CublasLtGemm(self.stream_handle)
                except CublasLtUnavailable as exc:
                    if mode == "cublaslt":
                        raise
                    log.warning("%s; matmuls of more than one row use the own mma.sync GEMM, "
                                "which decodes batches of 8-32 about 2.5x slower (H200, qwen3-8b "
                                "at 1,024 tokens, docs/benchmarks.md)", exc)
        # a policy swapped to ``mma`` after the handle was made (batch-invariant mode) wins
        return None if self.policy.gemm == "mma" else (self._lt or None)
