"""The measurements of ``atlas bench``: copy bandwidth, cold start, TTFT / prefill, decode."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atlas_core.bench.shapes import step_bytes


@dataclass
class BenchResult:
    """Everything one bench run measured (times in seconds, rates per second)."""

    model: str
    backend: str
    device: str
    copy_bandwidth_gbs: float = 0.0
    cold_start_s: float = 0.0
    prompt_len: int = 0
    ttft_s: float = 0.0
    prefill_tok_s: float = 0.0
    decode: dict[int, dict[str, float]] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)


def copy_bandwidth(backend: Any, nbytes: int) -> float:
    """Device-to-device copy rate in GB/s, counting bytes read plus bytes written."""
    a = backend.empty((nbytes,), np.uint8)
    b = backend.empty((nbytes,), np.uint8)
    backend.copy_(b, a)
    backend.synchronize()
    reps = 10
    start = time.perf_counter()
    for _ in range(reps):
        backend.copy_(b, a)
    backend.synchronize()
    return 2 * nbytes * reps / (time.perf_counter() - start) / 1e9


def _run(engine: Any, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[float]]:
    """Submit ``prompts`` together; return (time to first token of all, per-step end times)."""
    from atlas_core.engine import SamplingParams
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"bench-{time.monotonic_ns()}-{i}", p, params)
    start = time.perf_counter()
    first, stamps = None, []
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.perf_counter()
        if first is None and outs and all(o.outputs[0].token_ids for o in outs):
            first = now - start
        stamps.append(now)
    return first or 0.0, stamps


def measure(engine: Any, config: dict[str, Any], *, prompt_len: int, decode_tokens: int,
            concurrency: list[int], bandwidth_gbs: float, log=print) -> tuple[float, float, dict]:
    """TTFT and prefill rate for one prompt, then decode rates at each concurrency."""
    rng = np.random.default_rng(0)
    vocab = config["vocab_size"]
    prompt = rng.integers(0, vocab, prompt_len).tolist()
    log("warm-up")
    _run(engine, [prompt[:16]], 4)
    log("TTFT")
    _run(engine, [prompt], 1)  # the first long prefill grows the workspace and makes plans
    ttft, _ = _run(engine, [prompt], 1)
    decode = {}
    for c in concurrency:
        log(f"decode at batch {c}")
        prompts = [rng.integers(0, vocab, 128).tolist() for _ in range(c)]
        _run(engine, prompts, 8)
        _, stamps = _run(engine, prompts, decode_tokens)
        steps = len(stamps) - 2
        elapsed = stamps[-1] - stamps[1]
        tok_s = c * steps / elapsed
        ctx = 128 + decode_tokens // 2
        need = step_bytes(config, ctx, c)
        achieved = need * steps / elapsed / 1e9
        decode[c] = {"tok_s": tok_s, "step_ms": 1e3 * elapsed / steps, "gb_s": achieved,
                     "roofline_tok_s": c * bandwidth_gbs * 1e9 / need,
                     "pct_roofline": 100 * achieved / bandwidth_gbs}
    return ttft, prompt_len / ttft if ttft else 0.0, decode
