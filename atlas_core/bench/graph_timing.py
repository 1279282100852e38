"""Device time of captured work: median of event-timed CUDA graph replays (the micro-benchmark
scripts under ``scripts/`` and the decode-graph timers use these)."""

from __future__ import annotations

import statistics
from typing import Any, Callable


def replay_ms(backend: Any, graph: Any, reps: int = 200) -> float:
    """Median milliseconds of ``reps`` replays of ``graph``, each between two events, after one
    warm-up replay."""
    graph.replay()
    backend.synchronize()
    times = []
    for _ in range(reps):
        start = backend.event()
        graph.replay()
        end = backend.event()
        times.append(backend.elapsed_ms(start, end))
    return statistics.median(times)


def graph_ms(backend: Any, fn: Callable[[], Any], reps: int = 200) -> float:
    """Capture ``fn`` as a graph on ``backend`` and return :func:`replay_ms` of it."""
    return replay_ms(backend, backend.capture(fn), reps)
