"""Step workspace (bump arena) and the pinned staging ring used for host copies."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from atlas_cuda.array import DeviceArray
from atlas_cuda.driver import DeviceAllocation, PinnedAllocation, check, drv

ALIGN = 256


def require_eager(be: Any, what: str) -> None:
    """Refuse a one-time device allocation (counters, stacked weights) inside a graph capture:
    the first call of an op that makes one must run eagerly, as :meth:`CudaBackend.capture`
    does before it records."""
    if be._capturing:
        raise RuntimeError(f"{what}: first call inside a graph capture; run it once eagerly "
                           "first (CudaBackend.capture does)")


class WorkspaceFull(RuntimeError):
    """A captured step asked for more workspace than was reserved for it."""


class Workspace:
    """Op outputs of one step come from here; :meth:`reset` hands the same addresses out again.

    When a step outgrows the arena outside capture, a larger chunk is added and used from the
    next reset on, so steady-state steps allocate nothing.
    """

    def __init__(self, nbytes: int, growable: bool = True) -> None:
        self.chunk = DeviceAllocation(nbytes)
        self.extra: list[DeviceAllocation] = []
        self.offset = 0
        self.peak = 0
        self.growable = growable

    def reset(self) -> None:
        if self.extra:
            total = self.chunk.nbytes + sum(c.nbytes for c in self.extra)
            self.extra = []
            self.chunk = DeviceAllocation(total)
        self.offset = 0

    def alloc(self, shape: Sequence[int], dtype: Any) -> DeviceArray:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        size = (nbytes + ALIGN - 1) // ALIGN * ALIGN
        current = self.extra[-1] if self.extra else self.chunk
        if self.offset + size > current.nbytes:
            if not self.growable:
                raise WorkspaceFull(f"step workspace of {self.chunk.nbytes} bytes is full")
            self.extra.append(DeviceAllocation(max(size, self.chunk.nbytes)))
            self.offset = 0
        owner = self.extra[-1] if self.extra else self.chunk
        arr = DeviceArray(owner.ptr + self.offset, shape, dtype, owner)
        self.offset += size
        self.peak = max(self.peak, self.offset)
        return arr


class StagingRing:
    """Pinned host slots for async copies; a slot is reused only after its copy finished."""

    def __init__(self, slot_bytes: int = 8 << 20, num_slots: int = 4) -> None:
        self.slot_bytes = slot_bytes
        self.slots = [PinnedAllocation(slot_bytes) for _ in range(num_slots)]
        self.events = [check(drv().cuEventCreate(drv().CUevent_flags.CU_EVENT_DISABLE_TIMING))
                       for _ in range(num_slots)]
        self.used = [False] * num_slots
        self.next = 0

    def take(self) -> tuple[PinnedAllocation, Any]:
        i = self.next
        self.next = (i + 1) % len(self.slots)
        if self.used[i]:
            check(drv().cuEventSynchronize(self.events[i]))
        self.used[i] = True
        return self.slots[i], self.events[i]

    def upload(self, dst_ptr: int, src: np.ndarray, stream: Any) -> None:
        """Async host->device copy of the bytes of ``src`` (any size) through the slots."""
        raw = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        for start in range(0, raw.nbytes, self.slot_bytes):
            part = raw[start:start + self.slot_bytes]
            slot, event = self.take()
            slot.array[:part.nbytes] = part
            check(drv().cuMemcpyHtoDAsync(dst_ptr + start, slot.ptr, part.nbytes, stream))
            check(drv().cuEventRecord(event, stream))

    def download(self, dst: np.ndarray, src_ptr: int, stream: Any) -> None:
        """Device->host copy into ``dst`` (contiguous), waiting for each chunk."""
        raw = dst.reshape(-1).view(np.uint8)
        for start in range(0, raw.nbytes, self.slot_bytes):
            n = min(self.slot_bytes, raw.nbytes - start)
            slot, event = self.take()
            check(drv().cuMemcpyDtoHAsync(slot.ptr, src_ptr + start, n, stream))
            check(drv().cuEventRecord(event, stream))
            check(drv().cuEventSynchronize(event))
            raw[start:start + n] = slot.array[:n]
