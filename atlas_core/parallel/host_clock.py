"""Where a parallel run's host time goes (``ATLAS_PARALLEL_PROFILE=1``), by named phase.

A decode step of ``-tp N`` crosses processes: the engine plans it and sends its description,
each worker prepares its inputs and launches its graph, rank 0 waits for the sampled tokens
and sends them back. When the sum of that host work exceeds the device's step time, the GPUs
idle between steps and the step is host-bound, whatever the kernels do. Each process times
its phases with :class:`HostClock` and logs the totals at shutdown; off, every phase is a
shared no-op context.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict, deque
from typing import Any

import numpy as np

from atlas_core import env

log = logging.getLogger(__name__)
_OFF = contextlib.nullcontext()


#: Samples kept per phase (the most recent ones: the steady state, not the warm-up).
KEEP = 4096


class HostClock:
    """Seconds and counts per phase name (``with clock("recv"): ...``), and the latest
    :data:`KEEP` durations of each, whose median is the steady-state cost (kernel compiles and
    graph captures of the first steps only inflate the totals)."""

    def __init__(self, name: str, on: bool | None = None) -> None:
        self.name = name
        self.on = env.parallel_profile() if on is None else on
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.samples: dict[str, deque] = defaultdict(lambda: deque(maxlen=KEEP))
        self.started = time.perf_counter()
        self._ticks: dict[str, float] = {}

    def __call__(self, phase: str) -> Any:
        return _Phase(self, phase) if self.on else _OFF

    def tick(self, phase: str) -> None:
        """Record the time since this phase's previous tick (a cadence: the interval between
        consecutive decode launches is the step time the engine achieves)."""
        if not self.on:
            return
        now = time.perf_counter()
        last = self._ticks.get(phase)
        self._ticks[phase] = now
        if last is not None:
            self.seconds[phase] += now - last
            self.counts[phase] += 1
            self.samples[phase].append(now - last)

    def summary(self) -> str:
        """One line: wall seconds since the clock started, then per phase the count, the total
        ms and the median / 90th-percentile microseconds of the latest samples, largest total
        first."""
        wall = time.perf_counter() - self.started
        parts = []
        for p, total in sorted(self.seconds.items(), key=lambda kv: -kv[1]):
            q = np.percentile(np.fromiter(self.samples[p], float), [50, 90]) * 1e6
            parts.append(f"{p} x{self.counts[p]} {1e3 * total:.1f} ms, median {q[0]:.0f} us "
                         f"(p90 {q[1]:.0f})")
        return f"{self.name} host time over {wall:.2f} s: " + "; ".join(parts)

    def report(self) -> None:
        """Log :meth:`summary` (a warning, so it shows at the bench's quiet log level)."""
        if self.on and self.seconds:
            log.warning("%s", self.summary())


class _Phase:
    __slots__ = ("clock", "phase", "t0")

    def __init__(self, clock: HostClock, phase: str) -> None:
        self.clock, self.phase = clock, phase

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        dt = time.perf_counter() - self.t0
        self.clock.seconds[self.phase] += dt
        self.clock.counts[self.phase] += 1
        self.clock.samples[self.phase].append(dt)
