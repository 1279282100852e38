"""Measured cuBLASLt algorithm choice for the skinny matmuls of decode (policy ``gemm_tune``).

cuBLASLt's heuristic ranks algorithms by a model of the GPU; for the weight-streaming matmuls of
a decode step (2-256 rows against a weight of tens to hundreds of MB) its first choice is not
always the fastest (H200, qwen3-8b at batch 8: the heuristic's kernels read the layer's four
weights at 2.7-3.7 TB/s, ncu, session 23). With the policy on, :class:`~atlas_cuda.gemm_lt.
CublasLtGemm` asks the heuristic for :data:`TUNE_CANDIDATES` algorithms of each shape of at most
:data:`TUNE_MAX_ROWS` rows, times each on the real operands (:class:`GemmTimer`: the L2 flushed
before every run, so a weight that fits in L2 is timed as a step reads it, from DRAM) and keeps
the fastest. Only a decode graph's shapes are tuned, in the eager call that precedes its
capture (``CudaBackend.probing``), so the few ms a shape cost are paid at start-up, never in a
served eager step (prefill chunks keep the heuristic's first choice, whatever their size).

The algorithms compute the same product with fp32 accumulation; they may split K differently,
so outputs can differ in the last bits between two processes that timed differently (batch-
invariant mode never takes cuBLASLt).
"""

from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from atlas_cuda.driver import DeviceAllocation, check, drv

log = logging.getLogger(__name__)

#: Most rows a tuned shape has (decode steps; prefill chunks keep the heuristic's first choice).
TUNE_MAX_ROWS = 256
#: Algorithms the heuristic is asked for, and timed runs of each (the median counts).
TUNE_CANDIDATES, TUNE_REPS = 8, 5
#: Bytes written between timed runs to push the operands out of L2 (H100 / H200: 50 MB of L2).
FLUSH_BYTES = 128 << 20

#: ``cublasLtMatmulHeuristicResult_t`` (the C ABI: the 64-byte algorithm first, so a record's
#: address is its algorithm's): an array of these receives the heuristic's candidates.
HEURISTIC_DTYPE = np.dtype([("algo", "<u8", (8,)), ("workspace_size", "<u8"), ("state", "<i4"),
                            ("waves_count", "<f4"), ("reserved", "<i4", (4,))])


class Algo:
    """One algorithm of a heuristic result array: ``ptr`` (what ``cublasLtMatmul`` takes) and
    the array it lives in, kept alive with it."""

    def __init__(self, results: np.ndarray, index: int) -> None:
        self.results, self.index = results, index
        self.ptr = results.ctypes.data + index * results.itemsize


def usable(results: np.ndarray, count: int, workspace_limit: int) -> list[int]:
    """Indices of the first ``count`` records that succeeded and fit the workspace."""
    return [i for i in range(min(count, len(results)))
            if int(results["state"][i]) == 0
            and int(results["workspace_size"][i]) <= workspace_limit]


def pick_fastest(times: list[float | None]) -> int | None:
    """Index of the smallest time (None entries failed); None when every candidate failed.
    Ties go to the earlier candidate (the heuristic's order)."""
    best = None
    for i, t in enumerate(times):
        if t is not None and (best is None or t < times[best]):
            best = i
    return best


class GemmTimer:
    """Median device time of a launch, each run after an L2 flush, on one stream.

    Args:
        stream: the ``CUstream`` handle (int) the matmuls run on.
    """

    def __init__(self, stream: int) -> None:
        self.stream = stream
        self._events: list = []
        self._flush: DeviceAllocation | None = None
        self._flush_failed = False

    def _flush_buffer(self) -> DeviceAllocation | None:
        if self._flush is None and not self._flush_failed:
            try:
                self._flush = DeviceAllocation(FLUSH_BYTES)
            except Exception as exc:  # noqa: BLE001 - a full device: time with a warm L2
                self._flush_failed = True
                log.info("gemm_tune: no %d MB for the L2 flush (%s); timing with a warm L2",
                         FLUSH_BYTES >> 20, exc)
        return self._flush

    def _event_pairs(self, n: int) -> list:
        d = drv()
        while len(self._events) < n:
            self._events.append((check(d.cuEventCreate(0)), check(d.cuEventCreate(0))))
        return self._events[:n]

    def median_ms(self, launch: Callable[[], None], reps: int = TUNE_REPS) -> float:
        """Run ``launch`` once untimed, then ``reps`` times between events (each after an L2
        flush); the median elapsed ms. Raises what ``launch`` raises."""
        d = drv()
        stream = self.stream
        flush = self._flush_buffer()
        launch()
        pairs = self._event_pairs(reps)
        for start, end in pairs:
            if flush is not None:
                check(d.cuMemsetD32Async(flush.ptr, 0, FLUSH_BYTES // 4, stream))
            check(d.cuEventRecord(start, stream))
            launch()
            check(d.cuEventRecord(end, stream))
        check(d.cuStreamSynchronize(stream))
        return float(np.median([check(d.cuEventElapsedTime(s, e)) for s, e in pairs]))

    def close(self) -> None:
        """Destroy the events and free the flush buffer."""
        d = drv()
        for start, end in self._events:
            d.cuEventDestroy(start)
            d.cuEventDestroy(end)
        self._events.clear()
        self._flush = None
