"""HostArena: the host-memory tier's rows, allocated in large segments as the tier fills.

Every row is one block's future disk record (header room, then the payload), so a block spilled
from the device lands in its row once and goes to disk from there. Segments come from the
backend's :meth:`~atlas_core.interfaces.GpuBackend.empty_pinned` (page-locked on cuda: blocks
move between a row and the device without a bounce through a staging buffer) and are kept for
the life of the tier: rows are reused, never freed, so a full tier faults in no new pages.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Bytes of one segment of rows (at least one row).
SEGMENT_BYTES = 256 << 20


class HostArena:
    """At most ``capacity`` rows of ``row_bytes`` host bytes, numbered ``0 .. capacity - 1``.

    Args:
        backend: the GpuBackend whose ``empty_pinned`` provides the segments.
        row_bytes: bytes of one row.
        capacity: most rows.
        segment_bytes: bytes of each segment (rounded down to whole rows, at least one).
    """

    def __init__(self, backend: Any, row_bytes: int, capacity: int,
                 segment_bytes: int = SEGMENT_BYTES) -> None:
        self.backend, self.row_bytes, self.capacity = backend, row_bytes, capacity
        self.rows_per_segment = max(1, min(capacity, segment_bytes // max(1, row_bytes)))
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
            self.segments.append(self.backend.empty_pinned((n, self.row_bytes), np.uint8))
        self.num_rows += 1
        return self.num_rows - 1

    def give(self, row: int) -> None:
        """Hand ``row`` back for reuse."""
        self.free.append(row)

    def row(self, row: int) -> np.ndarray:
        """Row ``row``: ``uint8 [row_bytes]``, a view into its segment."""
        segment, i = divmod(row, self.rows_per_segment)
        return self.segments[segment][i]
