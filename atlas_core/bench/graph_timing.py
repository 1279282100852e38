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


def decode_graph(model: Any, backend: Any, prompt: int = 128, batch: int = 1, **engine_args: Any):
    """``(engine, graph)``: an engine for ``batch`` sequences after ``prompt``-token requests
    have been prefilled together and decoded a few tokens, and its decode graph for that batch
    (the setup every decode timing script under ``scripts/`` shares; a replay reruns the last
    step over those sequences' KV cache). ``engine_args`` override the
    :class:`~atlas_core.engine.EngineArgs` defaults (a KV cache just big enough)."""
    from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
    per_seq = -(-(prompt + 384) // 16)
    args = {"model": None, "max_num_seqs": batch, "max_prefill_tokens": min(prompt, 4096),
            "max_seq_len": prompt + 384, "num_kv_blocks": batch * per_seq + 8,
            "enable_prefix_caching": False, **engine_args}
    engine = LLMEngine(model, backend, EngineArgs(**args))
    # enough tokens that every sequence still runs once the last prompt is in (a prefill step
    # a chunk, while the sequences already in decode a token each)
    chunk = args["max_prefill_tokens"] or prompt
    tokens = 4 + -(-prompt * batch // chunk) if batch > 1 else 4
    for i in range(batch):
        engine.add_request(f"r{i}", list(range(1, prompt + 1)),
                           SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    if batch not in engine.runner.graphs:
        raise ValueError(f"{type(backend).__name__} captured no decode graph of {batch} "
                         "sequences; these timings need a backend with graphs (cuda)")
    return engine, engine.runner.graphs[batch][0]
