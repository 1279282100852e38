"""Device allocation and host <-> device copies of :class:`~atlas_cuda.backend.CudaBackend`.

Kept apart from the backend's policy and kernel binding: this half only needs the stream, the
staging rings and pinned memory, and the ``copy`` kernel for batched small copies.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from atlas_core.api import HostRead
from atlas_cuda.array import DeviceArray
from atlas_cuda.driver import DeviceAllocation, check, drv
from atlas_cuda.memory import PinnedHost, StagingRing

#: Copies up to this size go through the small staging slots (a step's inputs, token reads);
#: larger ones through the big ring.
SMALL_COPY_BYTES = 256 << 10


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


class DeviceTransfers:
    """The allocation and copy methods of :class:`~atlas_cuda.backend.CudaBackend` (a mixin:
    ``GpuBackend`` follows it in the backend's bases, so ``super()`` reaches its defaults).

    Uses the backend's ``stream``, ``kernels`` and ``_capturing``; :meth:`_init_transfers`
    makes the rest.
    """

    def _init_transfers(self) -> None:
        self.staging = StagingRing()
        # Step inputs: enough small slots that one step's uploads never wait for a slot whose
        # copy is queued behind the step in flight (async scheduling); reads get their own.
        self.small_staging = StagingRing(SMALL_COPY_BYTES, 32)
        self.read_staging = StagingRing(SMALL_COPY_BYTES, 4)
        self._copy_buffer: DeviceAllocation | None = None  # copy_many's device staging
        self.pinned = PinnedHost()

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
