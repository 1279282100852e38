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


def decode_graph(model: Any, backend: Any, prompt: int = 128, **engine_args: Any):
    """``(engine, graph)``: an engine for one sequence after a ``prompt``-token request has been
    prefilled and decoded a few tokens, and its batch-1 decode graph (the setup every decode
    timing script under ``scripts/`` shares). ``engine_args`` override the
    :class:`~atlas_core.engine.EngineArgs` defaults (a KV cache just big enough)."""
    from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
    args = {"model": None, "max_num_seqs": 1, "max_prefill_tokens": min(prompt, 4096),
            "max_seq_len": prompt + 384, "num_kv_blocks": -(-(prompt + 384) // 16) + 8,
            "enable_prefix_caching": False, **engine_args}
    engine = LLMEngine(model, backend, EngineArgs(**args))
    engine.add_request("r", list(range(1, prompt + 1)),
                       SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    if 1 not in engine.runner.graphs:
        raise ValueError(f"{type(backend).__name__} captured no decode graph; these timings "
                         "need a backend with graphs (cuda)")
    return engine, engine.runner.graphs[1][0]
