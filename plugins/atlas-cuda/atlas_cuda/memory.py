"""Step workspace (bump arena) and the pinned staging ring used for host copies."""

from __future__ import annotations

import bisect
import ctypes
import logging
import math
from typing import Any, Sequence

import numpy as np

from atlas_cuda.array import DeviceArray
from atlas_cuda.driver import CudaError, DeviceAllocation, PinnedAllocation, check, drv

log = logging.getLogger(__name__)

ALIGN = 256


def require_eager(be: Any, what: str) -> None:
    """Refuse a one-time device allocation (counters, stacked weights) inside a graph capture:
    the first call of an op that makes one must run eagerly, as :meth:`CudaBackend.capture`
    does before it records."""
    if be.capturing:
        raise RuntimeError(f"{what}: first call inside a graph capture; run it once eagerly "
                           "first (CudaBackend.capture does)")


class WorkspaceFull(RuntimeError):
    """A captured step asked for more workspace than was reserved for it."""


class Workspace:
    """Op outputs of one step come from here; :meth:`reset` hands the same addresses out again.

    When a step outgrows the arena outside capture, a larger chunk is added and used from the
    next reset on, so steady-state steps allocate nothing. :meth:`mark` / :meth:`rewind` give
    the space taken after a mark back within the step (a :class:`LayerScope` does so after each
    layer of a long prefill); chunks added after the mark are reused, in order, before new ones.
    """

    def __init__(self, nbytes: int, growable: bool = True) -> None:
        self.chunks = [DeviceAllocation(nbytes)]
        self.cur = 0  # chunk handing out space now
        self.offset = 0
        self.peak = 0  # bytes a single chunk would need for everything since the last reset
        self.growable = growable

    @property
    def chunk(self) -> DeviceAllocation:
        return self.chunks[0]

    def reset(self) -> None:
        if len(self.chunks) > 1:
            sizes = [c.nbytes for c in self.chunks]
            self.chunks = []  # give the chunks back before taking their sum in one piece
            try:
                self.chunks = [DeviceAllocation(sum(sizes))]
            except CudaError:  # fragmented or short of memory: grow chunk by chunk again
                log.warning("step workspace: no room for one %.0f MiB arena; keeping %.0f MiB "
                            "and growing it as steps need", sum(sizes) / 2**20, sizes[0] / 2**20)
                self.chunks = [DeviceAllocation(sizes[0])]
        self.cur = self.offset = 0

    def mark(self) -> tuple[int, int]:
        """Where the next allocation goes; :meth:`rewind` returns there."""
        return self.cur, self.offset

    def rewind(self, mark: tuple[int, int]) -> None:
        """Free (for this step's later allocations) everything allocated since ``mark``."""
        self.cur, self.offset = mark

    def alloc(self, shape: Sequence[int], dtype: Any) -> DeviceArray:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        size = (nbytes + ALIGN - 1) // ALIGN * ALIGN
        if self.offset + size > self.chunks[self.cur].nbytes:
            if not self.growable:
                raise WorkspaceFull(f"step workspace of {self.chunk.nbytes} bytes is full")
            nxt = next((i for i in range(self.cur + 1, len(self.chunks))
                        if self.chunks[i].nbytes >= size), None)
            if nxt is None:
                self.chunks.append(DeviceAllocation(max(size, self.chunk.nbytes)))
                nxt = len(self.chunks) - 1
            self.cur, self.offset = nxt, 0
        owner = self.chunks[self.cur]
        arr = DeviceArray(owner.ptr + self.offset, shape, dtype, owner)
        self.offset += size
        base = sum(c.nbytes for c in self.chunks[:self.cur])
        self.peak = max(self.peak, base + self.offset)
        return arr


class LayerScope:
    """Keeps a long step's workspace to about one layer's outputs: each :meth:`carry` copies the
    arrays a layer hands to the next into one of two slots taken at the start, then rewinds the
    workspace to just after them, so the next layer reuses the space of the one before (a bump
    arena alone holds every op output of the whole forward: ~2 GB a layer for a 16K-token
    qwen3-8b prefill). Two slots, used in turn: the arrays being copied may be the previous
    carry's (a layer that passes its residual through)."""

    def __init__(self, backend: Any, nbytes: int) -> None:
        self.be, self.ws = backend, backend.workspace
        self.nbytes = nbytes
        self.slots = [self.ws.alloc((nbytes,), np.uint8) for _ in range(2)]
        self.mark = self.ws.mark()
        self.turn = 0

    def carry(self, *arrays: DeviceArray | None) -> tuple:
        sizes = [0 if a is None else (a.nbytes + ALIGN - 1) // ALIGN * ALIGN for a in arrays]
        if sum(sizes) > self.nbytes:
            return arrays  # more than the slot holds: keep everything this time
        slot, off, out = self.slots[self.turn], 0, []
        for a, size in zip(arrays, sizes):
            if a is None:
                out.append(None)
                continue
            dst = DeviceArray(slot.ptr + off, a.shape, a.dtype, slot.owner)
            if a.nbytes:
                self.be.copy_(dst, a)
            out.append(dst)
            off += size
        self.turn ^= 1
        self.ws.rewind(self.mark)
        return tuple(out)


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


class PinnedHost:
    """Page-locked host arrays handed out by ``CudaBackend.empty_pinned``, and the address
    ranges they cover (so a copy can tell a pinned host array from a pageable one)."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int]] = []

    def empty(self, shape: Sequence[int], dtype: Any) -> np.ndarray:
        """An array in fresh page-locked memory, freed with its last view; pageable memory,
        with a warning, where the driver refuses to lock more."""
        shape = tuple(int(s) for s in shape)
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if not nbytes:
            return np.empty(shape, dtype)
        try:
            mem = PinnedAllocation(nbytes)
        except CudaError as exc:
            log.warning("cuda: %.0f MiB of page-locked host memory refused (%s); using pageable "
                        "memory, host<->device copies of it are slower", nbytes / (1 << 20), exc)
            return np.empty(shape, dtype)
        buf = (ctypes.c_uint8 * nbytes).from_address(mem.ptr)
        buf.allocation = mem  # the array keeps the buffer alive, the buffer the allocation
        bisect.insort(self.ranges, (mem.ptr, mem.ptr + nbytes))
        return np.frombuffer(buf, np.uint8).view(dtype).reshape(shape)

    def holds(self, array: np.ndarray) -> bool:
        """Whether ``array`` lies inside one array of :meth:`empty`. A range whose memory was
        freed and reused by pageable memory only makes a copy of it look pinned, which the
        driver still does correctly (synchronously)."""
        start = array.ctypes.data
        i = bisect.bisect_right(self.ranges, (start, math.inf)) - 1
        return i >= 0 and start + array.nbytes <= self.ranges[i][1]
