"""HostArena: the host-memory tier's rows, allocated in large segments as the tier fills.

Every row is one block's future disk record (header room, then the payload), so a block spilled
from the device lands in its row once and goes to disk from there, and a block read from disk
lands in its row straight from the file. Segments come from the backend's
:meth:`~atlas_core.interfaces.GpuBackend.empty_pinned` (page-locked on cuda: blocks move between
a row and the device without a bounce through a staging buffer) and are kept for the life of
the tier: rows are reused, never freed, so a full tier faults in no new pages.

Rows start on :data:`ALIGN` boundaries and are padded to a whole number of :data:`ALIGN` bytes
(:meth:`HostArena.record_buffer`): an ``O_DIRECT`` read needs an aligned buffer and length, so
a storage backend that bypasses the page cache reads a record into its row directly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Bytes of one segment of rows (at least one row).
SEGMENT_BYTES = 256 << 20
#: Alignment of row starts and row strides: the page size, which O_DIRECT reads accept.
ALIGN = 4096


def padded(nbytes: int, align: int = ALIGN) -> int:
    """``nbytes`` rounded up to a whole number of ``align`` bytes."""
    return -(-nbytes // align) * align


def aligned(buffer: np.ndarray, nbytes: int, align: int = ALIGN) -> np.ndarray:
    """The first ``nbytes`` of flat ``uint8`` ``buffer`` from its first ``align``-byte boundary
    (``buffer`` holds at least ``nbytes + align - 1`` bytes)."""
    start = -buffer.ctypes.data % align
    return buffer[start:start + nbytes]


def aligned_empty(nbytes: int, align: int = ALIGN) -> np.ndarray:
    """An uninitialised ``uint8 [nbytes]`` array whose start is ``align``-byte aligned."""
    return aligned(np.empty(nbytes + align, np.uint8), nbytes, align)


class HostArena:
    """At most ``capacity`` rows of ``row_bytes`` host bytes, numbered ``0 .. capacity - 1``.

    Args:
        backend: the GpuBackend whose ``empty_pinned`` provides the segments.
        row_bytes: bytes of one row.
        capacity: most rows.
        segment_bytes: bytes of each segment (rounded down to whole rows, at least one).
        align: alignment of each row's start and of the stride between rows.
    """

    def __init__(self, backend: Any, row_bytes: int, capacity: int,
                 segment_bytes: int = SEGMENT_BYTES, align: int = ALIGN) -> None:
        self.backend, self.row_bytes, self.capacity = backend, row_bytes, capacity
        self.align = align
        #: bytes from one row's start to the next's (``row_bytes`` padded to ``align``)
        self.stride = padded(max(1, row_bytes), align)
        self.rows_per_segment = max(1, min(capacity, segment_bytes // self.stride))
        #: ``uint8 [rows, stride]`` views, each starting on an ``align`` boundary
        self.segments: list[np.ndarray] = []
        self.free: list[int] = []
        self.num_rows = 0

    def take(self) -> int | None:
        """A free row (a new segment is allocated when the last is full); ``None`` when every
        row is in use."""
        if self.free:
            return self.free.pop()
        if self.num_rows >= self.capacity:
            return None
        if self.num_rows == len(self.segments) * self.rows_per_segment:
            n = min(self.rows_per_segment, self.capacity - self.num_rows)
            raw = self.backend.empty_pinned((n * self.stride + self.align,), np.uint8)
            self.segments.append(aligned(raw, n * self.stride, self.align).reshape(n, self.stride))
        self.num_rows += 1
        return self.num_rows - 1

    def give(self, row: int) -> None:
        """Hand ``row`` back for reuse."""
        self.free.append(row)

    def record_buffer(self, row: int) -> np.ndarray:
        """Row ``row`` with its padding: ``uint8 [stride]``, aligned, a view into its segment
        (what a storage backend reads a record into)."""
        segment, i = divmod(row, self.rows_per_segment)
        return self.segments[segment][i]

    def row(self, row: int) -> np.ndarray:
        """Row ``row``: ``uint8 [row_bytes]``, a view into its segment."""
        return self.record_buffer(row)[:self.row_bytes]
