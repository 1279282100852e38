"""CudaBackend: the GpuBackend over cuda.core (NVRTC kernels, stream capture into graphs)."""

from __future__ import annotations

import logging
import math
import threading
from typing import Any, Callable, Sequence

import numpy as np

from atlas_core.api import DeviceEvent, DeviceInfo, GpuBackend, Graph, HostRead, env
from atlas_core.api import OpRegistry
from atlas_core.api import QUANT_FORMATS, host_memory
from atlas_cuda.array import DeviceArray
from atlas_cuda.context import OpContext
from atlas_cuda.driver import DeviceAllocation, check, drv
from atlas_cuda.kernels_loader import KernelLibrary
from atlas_cuda.memory import LayerScope, PinnedHost, StagingRing, Workspace
from atlas_cuda.policy import KernelPolicy, target_policy, with_batch_invariance
from atlas_cuda.targets import pick_target

log = logging.getLogger(__name__)

DEFAULT_WORKSPACE_BYTES = 256 << 20
#: Bytes a layer hands to the next (hidden + residual) from which a step reuses each layer's
#: workspace (:class:`LayerScope`): 2 MiB = 256 tokens of a 4,096-wide bf16 model.
LAYER_SCOPE_BYTES = 2 << 20
SMALL_COPY_BYTES = 256 << 10


class CudaGraph(Graph):
    """An instantiated CUDA graph; ``output`` is what the captured function returned."""

    def __init__(self, exec_graph: Any, graph: Any, stream: Any, workspace: Workspace,
                 output: Any) -> None:
        self.exec_graph, self.graph, self.stream = exec_graph, graph, stream
        self.workspace = workspace
        self.output = output

    def replay(self) -> None:
        check(drv().cuGraphLaunch(self.exec_graph, self.stream))

    def __del__(self) -> None:
        try:
            drv().cuGraphExecDestroy(self.exec_graph)
            drv().cuGraphDestroy(self.graph)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class _PinnedRead(HostRead):
    def __init__(self, out: np.ndarray, slot: Any, event: Any) -> None:
        super().__init__(out)
        self.slot, self.event = slot, event

    def wait(self) -> np.ndarray:
        if self.event is not None:
            check(drv().cuEventSynchronize(self.event))
            raw = self.array.reshape(-1).view(np.uint8)
            raw[:] = self.slot.array[:raw.nbytes]
            self.event = None
        return self.array


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


class CudaBackend(GpuBackend):
    """NVIDIA GPUs through cuda-python.

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
        self.quantized_weight_formats = (frozenset(QUANT_FORMATS) if self.policy.quant_weights
                                         else frozenset())
        log.info("cuda kernel policy (%s target): %s", self.target.name, self.policy.summary())
        self.staging = StagingRing()
        # Step inputs: enough small slots that one step's uploads never wait for a slot whose
        # copy is queued behind the step in flight (async scheduling); reads get their own.
        self.small_staging = StagingRing(SMALL_COPY_BYTES, 32)
        self.read_staging = StagingRing(SMALL_COPY_BYTES, 4)
        self.num_sms = self.device.properties.multiprocessor_count
        #: an integrated GPU on the host's RAM (GB10): memory_info is capped by MemAvailable
        self.unified_memory = bool(getattr(self.device.properties, "integrated", False))
        self.l2_bytes = self.device.properties.l2_cache_size
        self._capturing = False
        self._copy_buffer: DeviceAllocation | None = None  # copy_many's device staging
        self.pinned = PinnedHost()
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
        self.quantized_weight_formats = (frozenset(QUANT_FORMATS) if policy.quant_weights
                                         else frozenset())
        log.info("cuda kernel policy now: %s", policy.summary())

    @property
    def capturing(self) -> bool:
        """Whether a CUDA graph is being captured on this backend's stream (ops then take no
        path that syncs with the host or allocates)."""
        return self._capturing

    @property
    def workspace(self) -> Workspace:
        """The current step arena (the op context's; graph capture swaps in its own)."""
        return self.ctx.workspace

    @workspace.setter
    def workspace(self, value: Workspace) -> None:
        self.ctx.workspace = value

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

    def empty(self, shape: Sequence[int], dtype: Any) -> DeviceArray:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        mem = DeviceAllocation(nbytes)
        return DeviceArray(mem.ptr, shape, dtype, mem)

    def zeros(self, shape: Sequence[int], dtype: Any) -> DeviceArray:
        arr = self.empty(shape, dtype)
        check(drv().cuMemsetD8Async(arr.ptr, 0, arr.nbytes, self.stream))
        return arr

    def from_host(self, array: np.ndarray) -> DeviceArray:
        array = np.asarray(array)
        arr = self.empty(array.shape, array.dtype)
        self.copy_from_host(arr, array)
        return arr

    def copy_from_host(self, dst: DeviceArray, src: np.ndarray) -> None:
        src = np.asarray(src)
        if src.nbytes != dst.nbytes:
            raise ValueError(f"copy_from_host: {src.nbytes} host bytes into {dst.nbytes} device bytes")
        if src.nbytes:
            ring = self.small_staging if src.nbytes <= SMALL_COPY_BYTES else self.staging
            ring.upload(dst.ptr, src.astype(dst.dtype, copy=False), self.stream)

    def copy_many(self, host_pairs: Sequence[tuple[DeviceArray, np.ndarray]],
                  device_pairs: Sequence[tuple[DeviceArray, DeviceArray]] = ()) -> None:
        """A batch of small copies (a decode step's inputs) as one pinned slot, one host-to-device
        transfer and one ``copy_segments`` launch (``kernels/cuda/common/copy.cu``) instead of a
        transfer per array; larger batches, or under graph capture, one copy at a time."""
        hosts = [(d, np.asarray(s)) for d, s in host_pairs]
        for dst, src in [*hosts, *device_pairs]:
            if src.nbytes != dst.nbytes:
                raise ValueError(f"copy_many: {src.nbytes} source bytes into {dst.nbytes} "
                                 "device bytes")
        hosts = [(d, s) for d, s in hosts if d.nbytes]
        devs = [(d, s) for d, s in device_pairs if d.nbytes]
        n = len(hosts) + len(devs)
        header = -(-24 * n // 16) * 16
        total = header + sum(-(-d.nbytes // 16) * 16 for d, _ in hosts)
        if n < 2 or total > SMALL_COPY_BYTES or self._capturing:
            return super().copy_many(hosts, devs)
        if self._copy_buffer is None:
            self._copy_buffer = DeviceAllocation(SMALL_COPY_BYTES)
        base = self._copy_buffer.ptr
        slot, event = self.small_staging.take()
        buf = slot.array
        table = np.empty((n, 3), np.uint64)
        off = header
        for i, (dst, src) in enumerate(hosts):
            raw = np.ascontiguousarray(src.astype(dst.dtype, copy=False)).reshape(-1).view(np.uint8)
            buf[off:off + raw.nbytes] = raw
            table[i] = (dst.ptr, base + off, dst.nbytes)
            off += -(-raw.nbytes // 16) * 16
        for i, (dst, src) in enumerate(devs, len(hosts)):
            table[i] = (dst.ptr, src.ptr, dst.nbytes)
        buf[:table.nbytes] = table.reshape(-1).view(np.uint8)
        check(drv().cuMemcpyHtoDAsync(base, slot.ptr, off, self.stream))
        check(drv().cuEventRecord(event, self.stream))
        self.kernels.launch(self.kernels.kernel("copy", "any", "copy_segments"), n, 128,
                            np.uint64(base))

    def empty_pinned(self, shape: Sequence[int], dtype: Any) -> np.ndarray:
        """Page-locked host memory (``cuMemAllocHost``), freed with the last view of it; pageable
        memory, with a warning, where the driver refuses to lock more."""
        return self.pinned.empty(shape, dtype)

    def record_event(self) -> DeviceEvent:
        """``cuEventRecord`` (timing off) on the stream every copy and op goes to."""
        try:
            handle = self._free_events.pop()
        except IndexError:
            flags = drv().CUevent_flags.CU_EVENT_DISABLE_TIMING
            handle = check(drv().cuEventCreate(flags))
        check(drv().cuEventRecord(handle, self.stream))
        return _StreamEvent(self, handle)

    def copy_from_host_async(self, dst: DeviceArray, src: np.ndarray) -> None:
        """From an :meth:`empty_pinned` array: one DMA copy, queued (``src`` must stay
        unchanged until :meth:`synchronize`); from pageable memory: :meth:`copy_from_host`."""
        src = np.asarray(src)
        if not (src.flags.c_contiguous and src.dtype == dst.dtype and self.pinned.holds(src)):
            return self.copy_from_host(dst, src)
        if src.nbytes != dst.nbytes:
            raise ValueError(f"copy_from_host_async: {src.nbytes} host bytes into {dst.nbytes} "
                             "device bytes")
        if src.nbytes:
            check(drv().cuMemcpyHtoDAsync(dst.ptr, src.ctypes.data, src.nbytes, self.stream))

    def copy_to_host_async(self, dst: np.ndarray, src: DeviceArray) -> None:
        """Into an :meth:`empty_pinned` array: one DMA copy, queued (``dst`` holds the bytes
        after :meth:`synchronize`); into pageable memory: through the staging ring, done on
        return."""
        if dst.nbytes != src.nbytes:
            raise ValueError(f"copy_to_host_async: {src.nbytes} device bytes into {dst.nbytes} "
                             "host bytes")
        if not (dst.flags.c_contiguous and dst.flags.writeable):
            raise ValueError("copy_to_host_async: the host array must be contiguous and writable")
        if not dst.nbytes:
            return
        if self.pinned.holds(dst):
            check(drv().cuMemcpyDtoHAsync(dst.ctypes.data, src.ptr, dst.nbytes, self.stream))
        else:
            self.staging.download(dst, src.ptr, self.stream)

    def to_host(self, array: DeviceArray) -> np.ndarray:
        out = np.empty(array.shape, array.dtype)
        if out.nbytes:
            self.staging.download(out, array.ptr, self.stream)
        return out

    def to_host_async(self, array: DeviceArray) -> HostRead:
        """Queue the copy into a pinned slot and record an event; ``wait()`` syncs on that
        event only, not on work queued after it."""
        out = np.empty(array.shape, array.dtype)
        if not out.nbytes or out.nbytes > SMALL_COPY_BYTES:
            return HostRead(self.to_host(array))
        slot, event = self.read_staging.take()
        check(drv().cuMemcpyDtoHAsync(slot.ptr, array.ptr, out.nbytes, self.stream))
        check(drv().cuEventRecord(event, self.stream))
        return _PinnedRead(out, slot, event)

    def copy_(self, dst: DeviceArray, src: DeviceArray) -> None:
        if dst.nbytes != src.nbytes:
            raise ValueError(f"copy_: {src.nbytes} bytes into {dst.nbytes}")
        check(drv().cuMemcpyDtoDAsync(dst.ptr, src.ptr, src.nbytes, self.stream))

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

    def reset_workspace(self) -> None:
        self.ensure_current()
        self.workspace.reset()

    def layer_scope(self, nbytes: int) -> LayerScope | None:
        """A :class:`LayerScope` for steps whose layers hand on at least
        :data:`LAYER_SCOPE_BYTES` (prefill chunks; decode steps keep their plain arena), else
        None. The choice depends on the size only, so a graph's probe run and its capture agree."""
        return LayerScope(self, nbytes) if nbytes >= LAYER_SCOPE_BYTES else None

    @property
    def supports_graphs(self) -> bool:
        return True

    def capture(self, fn: Callable[[], Any]) -> CudaGraph:
        """Record ``fn``'s device work as a CUDA graph with its own workspace.

        ``fn`` runs once eagerly first (it compiles and loads its kernels and sizes the graph's
        private workspace), then once under stream capture. The returned graph's ``output`` is
        the captured call's return value; its arrays are rewritten by every replay.
        """
        main = self.workspace
        probe = Workspace(main.chunk.nbytes)
        self.workspace = probe
        try:
            fn()
            self.synchronize()
            graph_ws = Workspace(max(probe.peak, ALIGN_MIN), growable=False)
            self.workspace = graph_ws
            mode = drv().CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            check(drv().cuStreamBeginCapture(self.stream, mode))
            self._capturing = True
            try:
                output = fn()
            finally:
                self._capturing = False
                graph = check(drv().cuStreamEndCapture(self.stream))
            exec_graph = check(drv().cuGraphInstantiate(graph, 0))
        finally:
            self.workspace = main
        return CudaGraph(exec_graph, graph, self.stream, graph_ws, output)

    def event(self) -> Any:
        """Record a timing event on the backend's stream (``elapsed_ms(a, b)`` reads two)."""
        ev = check(drv().cuEventCreate(drv().CUevent_flags.CU_EVENT_DEFAULT))
        check(drv().cuEventRecord(ev, self.stream))
        return ev

    @staticmethod
    def elapsed_ms(start: Any, end: Any) -> float:
        check(drv().cuEventSynchronize(end))
        return float(check(drv().cuEventElapsedTime(start, end)))

    def close(self) -> None:
        self.synchronize()


ALIGN_MIN = 1 << 20
