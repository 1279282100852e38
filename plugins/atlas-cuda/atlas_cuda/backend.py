"""CudaBackend: the GpuBackend over cuda.core (NVRTC kernels, stream capture into graphs)."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any

import numpy as np

from atlas_core.api import DeviceEvent, DeviceInfo, GpuBackend, env
from atlas_core.api import OpRegistry
from atlas_core.api import QUANT_FORMATS, host_memory
from atlas_cuda.array import DeviceArray
from atlas_cuda.context import OpContext
from atlas_cuda.driver import check, drv
from atlas_cuda.graphs import ALIGN_MIN, CudaGraph, GraphCapture
from atlas_cuda.kernels_loader import KernelLibrary
from atlas_cuda.memory import LayerScope, Workspace
from atlas_cuda.policy import KernelPolicy, target_policy, with_batch_invariance
from atlas_cuda.targets import pick_target
from atlas_cuda.transfers import SMALL_COPY_BYTES, DeviceTransfers

log = logging.getLogger(__name__)

DEFAULT_WORKSPACE_BYTES = 256 << 20
#: Bytes a layer hands to the next (hidden + residual) from which a step reuses each layer's
#: workspace (:class:`LayerScope`): 2 MiB = 256 tokens of a 4,096-wide bf16 model.
LAYER_SCOPE_BYTES = 2 << 20
# The graph and copy halves live in graphs.py and transfers.py; their names stay importable here.
__all__ = ["ALIGN_MIN", "DEFAULT_WORKSPACE_BYTES", "LAYER_SCOPE_BYTES", "SMALL_COPY_BYTES",
           "CudaBackend", "CudaGraph"]


class _StreamEvent(DeviceEvent):
    """A ``cuEventRecord`` on the backend's stream; its handle goes back to the backend's free
    list when the last reference goes (no driver call at garbage collection, on whatever
    thread that runs)."""

    def __init__(self, backend: "CudaBackend", handle: Any) -> None:
        self.backend, self.handle = backend, handle
        self.done = False

    def query(self) -> bool:
        if not self.done:
            self.backend.ensure_current()
            err = drv().cuEventQuery(self.handle)
            err = err[0] if isinstance(err, tuple) else err
            if err == drv().CUresult.CUDA_ERROR_NOT_READY:
                return False
            check(err)
            self.done = True
        return True

    def wait(self) -> None:
        if not self.done:
            # The disk tier's checksum threads wait here too: make the context current there.
            self.backend.ensure_current()
            check(drv().cuEventSynchronize(self.handle))
            self.done = True

    def __del__(self) -> None:
        handle, self.handle = getattr(self, "handle", None), None
        if handle is not None:
            self.backend._free_events.append(handle)


class CudaBackend(DeviceTransfers, GraphCapture, GpuBackend):
    """NVIDIA GPUs through cuda-python; allocation and copies come from
    :class:`~atlas_cuda.transfers.DeviceTransfers`, graph capture from
    :class:`~atlas_cuda.graphs.GraphCapture`.

    Args:
        device_id: CUDA device ordinal.
        workspace_bytes: initial size of the per-step output arena (grows outside capture).
        model: optional model family name selecting ``kernels/<hw>/<model>/`` overrides and
            the ``[policy]`` of its MODEL.toml.
        quant: optional quantisation name (``bf16``…) for ``kernels/<hw>/<model>/<quant>/``.
        policy: a resolved :class:`~atlas_cuda.policy.KernelPolicy` (default: resolved from the
            target, the model and the ``ATLAS_CUDA_*`` environment, once).
        op_registry: the registered ops and kernel source folders the op table and kernel
            search path are built from (default: those of a fresh plugin manager).
        batch_invariant: start in batch-invariant mode (:meth:`set_batch_invariant`).

    Attributes:
        ctx: the :class:`~atlas_cuda.context.OpContext` every op class takes.
        policy: the frozen kernel policy (logged once at creation).
    """

    name = "cuda"
    #: Quantized weight formats kept on the device (``atlas_cuda.ops_quant``): all of them with
    #: the policy's ``quant_weights``, else none (the loader dequantizes at load).
    quantized_weight_formats: frozenset = frozenset()
    keep_quantized_hint = ("set ATLAS_CUDA_QUANT_WEIGHTS=1 to keep FP8 / NVFP4 weights quantized "
                           "on the device")
    #: KV caches the cache-write and attention ops read: fp8, and nvfp4 rows (atlas_cuda.
    #: ops_kv_nvfp4: the CUDA-core decode kernel reads them; prefill dequantizes to scratch).
    kv_cache_dtypes = frozenset({"bf16", "fp8", "nvfp4"})

    def __init__(self, device_id: int = 0, workspace_bytes: int | None = None,
                 model: str | None = None, quant: str | None = None,
                 policy: KernelPolicy | None = None, op_registry: OpRegistry | None = None,
                 batch_invariant: bool = False, **_: Any) -> None:
        from cuda.core import Device
        self.op_registry = op_registry if op_registry is not None else OpRegistry.load()
        self.device = Device(device_id)
        self.device.set_current()
        self._current = threading.local()
        self._current.ok = True
        self.stream_obj = self.device.create_stream()
        self.stream = int(self.stream_obj.handle)
        cc = self.device.compute_capability
        self.capability = (cc.major, cc.minor)
        self.target = pick_target(self.capability)
        self.kernels = self._library(model, quant)
        self._batch_invariant = False
        self.policy = policy or target_policy(self.target, model, quant)
        self.quantized_weight_formats = self._kept_formats(self.policy)
        log.info("cuda kernel policy (%s target): %s", self.target.name, self.policy.summary())
        self._init_transfers()
        self.num_sms = self.device.properties.multiprocessor_count
        #: an integrated GPU on the host's RAM (GB10): memory_info is capped by MemAvailable
        self.unified_memory = bool(getattr(self.device.properties, "integrated", False))
        self.l2_bytes = self.device.properties.l2_cache_size
        #: opt-in shared memory a block may take (227 KB on Hopper, 99 KB on GB10)
        self.smem_optin = int(getattr(self.device.properties, "max_shared_memory_per_block_optin",
                                      0) or 0)
        self._capturing = False
        self._probing = False
        self._free_events: list[Any] = []  # event handles of record_event, for reuse
        self._bound: tuple[str, str | None] | None = None
        self.ctx = OpContext(self, self.kernels,
                             Workspace(workspace_bytes or DEFAULT_WORKSPACE_BYTES), self.policy)
        from atlas_cuda.ops import build_op_table
        self.ops = build_op_table(self.ctx, self.op_registry)
        if batch_invariant or self.policy.batch_invariant:
            self.set_batch_invariant(True)

    def _library(self, model: str | None, quant: str | None) -> KernelLibrary:
        return KernelLibrary(self.target, self, model=model, quant=quant,
                             cache_dir=env.cache_dir() / "kernels",
                             extra_dirs=self.op_registry.kernel_source_dirs())

    def bind_model(self, model: str | None, quant: str | None = None) -> None:
        """Choose kernels for model family ``model`` (its ``kernels/<hw>/<model>/[<quant>/]``
        sources and MODEL.toml ``[policy]``, then the environment).

        Binding again to the same family and format is a no-op. Binding another one after
        kernels were loaded (one backend serving several models in a process, as the test
        suites do) starts a fresh kernel library for it: kernels already launched or captured
        in graphs keep their modules; every later launch uses the new family's sources.
        """
        model = self.target.model_folder(model)
        if model is None or (model, quant) == self._bound:
            return
        if self.kernels.modules:
            log.info("cuda backend: rebinding kernels from %s to %s/%s", self._bound, model, quant)
        self._bound = (model, quant)
        self.kernels = self._library(model, quant)
        self.ctx.kernels, self.ctx.launch = self.kernels, self.kernels.launch
        self.set_policy(target_policy(self.target, model, quant))

    def set_batch_invariant(self, on: bool) -> None:
        """Batch-invariant mode (``EngineArgs.batch_invariant``, ``ATLAS_CUDA_BATCH_INVARIANT``):
        the policy's ``batch_invariant`` preset (:data:`~atlas_cuda.policy.
        BATCH_INVARIANT_FIELDS`), kept when :meth:`bind_model` resolves the policy again. Call it
        before the weights load (quantized weights are then dequantized) and before graphs are
        captured. Turning it off restores the target / model / environment policy."""
        if bool(on) == self._batch_invariant:
            return
        self._batch_invariant = bool(on)
        if on:
            log.info("batch-invariant mode on: every linear takes the mma GEMM (no GEMV, no "
                     "cuBLASLt), attention the split-K kernel with one split for every row "
                     "(no flash, no fused rope + decode), MoE the router linear and grouped "
                     "GEMM, GDN the token-sequential recurrence (unfused decode), quantized "
                     "weights dequantized; a request's tokens and logprobs do not depend on "
                     "the rest of the batch (docs/serving.md, Determinism)")
            self.set_policy(self.policy)
        else:
            model, quant = self._bound or (None, None)
            self.set_policy(target_policy(self.target, model, quant))

    def set_policy(self, policy: KernelPolicy) -> None:
        """Replace the kernel policy (tests and A/B timing; see :meth:`OpContext.set_policy`);
        in batch-invariant mode its preset is applied on top."""
        if self._batch_invariant and not policy.batch_invariant:
            policy = with_batch_invariance(policy)
        elif policy.batch_invariant:
            self._batch_invariant = True
        self.policy = policy
        self.ctx.set_policy(policy)
        self.quantized_weight_formats = self._kept_formats(policy)
        log.info("cuda kernel policy now: %s", policy.summary())

    def _kept_formats(self, policy: KernelPolicy) -> frozenset:
        """The quantized formats kept on the device under ``policy`` (none after
        ``--dequantize-weights``)."""
        if policy.quant_weights and not self.dequantize_requested:
            return frozenset(QUANT_FORMATS)
        return frozenset()

    def keep_quantized(self) -> bool:
        """Keep FP8 / NVFP4 weights quantized from now on (the policy's ``quant_weights``, as
        ``ATLAS_CUDA_QUANT_WEIGHTS=1``): the loaders ask when a checkpoint fits only so. Not in
        batch-invariant mode, whose linears all take the bf16 mma GEMM."""
        if self._batch_invariant or self.dequantize_requested:
            return False
        if not self.policy.quant_weights:
            self.set_policy(replace(self.policy, quant_weights=True))
        return True

    @property
    def workspace(self) -> Workspace:
        """The current step arena (the op context's; graph capture swaps in its own)."""
        return self.ctx.workspace

    @workspace.setter
    def workspace(self, value: Workspace) -> None:
        self.ctx.workspace = value

    @staticmethod
    def compile_seconds() -> float:
        """Seconds this process has spent compiling kernels (NVRTC cache misses): a step that
        compiles is slow, not hung, so the multi-GPU step watchdog adds them to its deadline."""
        from atlas_cuda.compiler import compiled_seconds
        return compiled_seconds()

    def device_info(self) -> DeviceInfo:
        return DeviceInfo(self.device.name, "cuda", self.memory_info()[1],
                          f"{self.capability[0]}.{self.capability[1]}", self.unified_memory)

    def memory_info(self) -> tuple[int, int]:
        """``(free, total)`` from the driver; on unified memory the free part is at most the
        host's MemAvailable (the driver's figure ignores what the OS and page cache need)."""
        free, total = check(drv().cuMemGetInfo())
        if self.unified_memory:
            free = min(int(free), host_memory()[0])
        return int(free), int(total)

    def record_event(self) -> DeviceEvent:
        """``cuEventRecord`` (timing off) on the stream every copy and op goes to."""
        try:
            handle = self._free_events.pop()
        except IndexError:
            flags = drv().CUevent_flags.CU_EVENT_DISABLE_TIMING
            handle = check(drv().cuEventCreate(flags))
        check(drv().cuEventRecord(handle, self.stream))
        return _StreamEvent(self, handle)

    def synchronize(self) -> None:
        check(drv().cuStreamSynchronize(self.stream))

    def fill_random(self, array: DeviceArray, seed: int, std: float, mean: float = 0.0) -> None:
        """Uniform values of the given mean and std drawn on the device (``random.cu``);
        one-byte arrays (quantized codes) get FP8 codes or uniform bytes
        (:meth:`~atlas_cuda.ops_quant.QuantOps.fill_random`)."""
        from atlas_cuda.kernels_loader import variant_of
        if array.dtype.itemsize == 1:
            from atlas_cuda.ops_quant import QuantOps
            return self.ctx.bind(QuantOps).fill_random(array, seed, std, mean)
        try:
            v = variant_of(array.dtype)
        except TypeError:
            return super().fill_random(array, seed, std, mean)
        if array.size:
            k = self.kernels.kernel("random", v, f"fill_random_{v}")
            self.kernels.launch(k, min(-(-array.size // 256), 1 << 16), 256, array,
                                np.int64(array.size), np.uint64(seed & (2**64 - 1)),
                                float(mean), float(std))

    def ensure_current(self) -> None:
        """Make the device's context current on the calling thread (once per thread): the
        server steps the engine on its own thread, where no context is current yet."""
        if not getattr(self._current, "ok", False):
            self.device.set_current()
            self._current.ok = True

    def matmul_library(self) -> str:
        """What runs matmuls of more than one row, for bench reports: numbers taken without
        cuBLASLt are not those of the shipped configuration."""
        own = "the own mma.sync GEMM"
        if self.policy.gemm == "mma":
            return f"{own} (policy gemm=mma)"
        try:
            lt = self.ctx.cublaslt()
        except Exception as exc:  # noqa: BLE001 - gemm=cublaslt without the library
            return f"{own} (cuBLASLt unavailable: {exc})"
        if lt is None:
            return (f"{own}: nvmath-python (cuBLASLt) is not installed, "
                    "pip install 'atlas-cuda[cublas]'")
        if self.policy.gemm == "skinny":
            return "cuBLASLt, 2-32 rows on qskinny_dense (policy gemm=skinny)"
        return "cuBLASLt"

    def reset_workspace(self) -> None:
        self.ensure_current()
        self.workspace.reset()

    def layer_scope(self, nbytes: int) -> LayerScope | None:
        """A :class:`LayerScope` for steps whose layers hand on at least
        :data:`LAYER_SCOPE_BYTES` (prefill chunks; decode steps keep their plain arena), else
        None. The choice depends on the size only, so a graph's probe run and its capture agree."""
        return LayerScope(self, nbytes) if nbytes >= LAYER_SCOPE_BYTES else None

    def event(self) -> Any:
        """Record a timing event on the backend's stream (``elapsed_ms(a, b)`` reads two and
        destroys them)."""
        ev = check(drv().cuEventCreate(drv().CUevent_flags.CU_EVENT_DEFAULT))
        check(drv().cuEventRecord(ev, self.stream))
        return ev

    @staticmethod
    def elapsed_ms(start: Any, end: Any) -> float:
        """Milliseconds from ``start`` to ``end`` (two :meth:`event` s), waiting for ``end``;
        both events are destroyed after (each pair is read once: a timing loop of 200 replays
        no longer leaves 400 events behind)."""
        d = drv()
        try:
            check(d.cuEventSynchronize(end))
            return float(check(d.cuEventElapsedTime(start, end)))
        finally:
            d.cuEventDestroy(start)
            d.cuEventDestroy(end)

    def close(self) -> None:
        self.synchronize()
