"""The real :class:`Scheduler` under a mixed serving load on a simulated clock (issue #31).

No model runs: each planned step advances the clock by :class:`StepCost`, a cost shaped like a
transformer forward on a GPU, times a little random jitter, and every sequence whose chunk
reaches the end of its stream gets a token. :class:`MixedLoad` mirrors
``scripts/sched_bench.py``: streaming chats arriving all through the run plus a long prompt
every few seconds. :func:`simulate` returns the numbers that script prints, so fifo and slo
compare in CI the way they do on the lent GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from atlas_core.engine.block_manager import BlockManager
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.engine.scheduler import Scheduler, SchedulerOutput
from atlas_core.engine.scheduling_policy import SchedulingPolicy, create_scheduling_policy
from atlas_core.engine.sequence import Sequence


@dataclass(frozen=True)
class StepCost:
    """Seconds of one step::

        base + per_row * decode_rows + (eager if any prefill chunk) + sum over prefill chunks
            of per_token * n + per_pair * max(n, attn_min_tokens) * (start + n / 2)

    A chunk of ``n`` tokens from position ``start`` attends to about ``start + n / 2`` keys per
    token, so late chunks of a long prompt cost more per token; below ``attn_min_tokens`` the
    attention kernel no longer fills the GPU and a chunk costs as much as that many tokens.
    A decode-only step replays a CUDA graph; a step with any prefill chunk runs eagerly (every
    kernel launched from the host) and pays ``eager`` more, however small its chunk.

    The defaults are qwen3-8b on the H200 (``docs/benchmarks.md``): ``base`` the batch-1 decode
    step (4.2 ms) plus the engine's host time (the fifo chat TBT p50 of ``sched_bench`` is
    5.4 ms); ``per_row`` so that 30 rows take 5.6 ms; ``per_token`` and ``per_pair`` solve the
    4,096-token TTFT (144.6 ms, one eager chunk) and the cold 32,768-token prefill in
    8,192-token chunks (3.05 s, ~75% of it attention); ``attn_min_tokens`` is one wave of
    64-row query tiles of 32 heads over 132 SMs, which makes 64-token chunks deep in a 32k
    prompt crawl as they did on the GPU. ``eager`` is fitted to ``sched_bench``'s own numbers
    (20 s, same session): with it the simulation gives fifo 5.3 / 38.9 ms chat TBT p50 / p99,
    2.88 s chat TTFT p99, 3.12 s 32k TTFT against the GPU's 5.4 / 39.6 ms, 2.83 s, 3.17 s, and
    the slo of ff32a8f 6.0 / 52.5 ms, 7.99 s, 8.24 s against 6.3 / 62.7 ms, 7.72 s, 7.97 s;
    without it (all steps alike) fifo's p99 was 11.3 ms and that slo's TTFTs 1.1x fifo's, the
    ranking the GPU contradicted. fifo's p99 is the ~37 ms step that admits one chat prompt.
    """

    base: float = 5.0e-3
    per_row: float = 20e-6
    per_token: float = 18.7e-6
    per_pair: float = 4.3e-9
    attn_min_tokens: int = 256
    eager: float = 27e-3

    def __call__(self, out: SchedulerOutput) -> float:
        seconds = self.base
        for s in out.scheduled:
            if s.num_tokens == 1 and not s.seq.is_prefilling:
                seconds += self.per_row
            else:
                n = s.num_tokens
                width = max(n, self.attn_min_tokens)
                seconds += self.per_token * n + self.per_pair * width * (s.start + n / 2)
        if not out.is_decode_only:
            seconds += self.eager
        return seconds


@dataclass(frozen=True)
class MixedLoad:
    """``chats`` users each sending a ``chat_prompt``-token prompt for ``chat_tokens`` tokens,
    the first ``chat_gap`` seconds apart and a new one every ``chat_tokens * 0.03 + 0.5``
    seconds; plus a ``long_prompt``-token prompt (4 tokens out) from ``long_first`` every
    ``long_every`` seconds; arrivals stop at ``duration`` (``scripts/sched_bench.py``'s load)."""

    chats: int = 30
    chat_prompt: int = 200
    chat_tokens: int = 128
    chat_gap: float = 0.1
    long_prompt: int = 32768
    long_first: float = 2.0
    long_every: float = 10.0
    duration: float = 30.0

    def arrivals(self) -> list[tuple[float, str, int, int]]:
        """``(time, request_id, prompt_len, max_tokens)`` in time order."""
        load = []
        for user in range(self.chats):
            t, i = user * self.chat_gap, 0
            while t < self.duration:
                load.append((t, f"chat{user}-{i}", self.chat_prompt, self.chat_tokens))
                t += self.chat_tokens * 0.03 + 0.5
                i += 1
        t, i = self.long_first, 0
        while t < self.duration:
            load.append((t, f"long{i}", self.long_prompt, 4))
            t += self.long_every
            i += 1
        return sorted(load)


class SimClock:
    """Seconds of simulated time; :func:`simulate` moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def simulate(policy: str | Callable[[SimClock], SchedulingPolicy], load: MixedLoad = MixedLoad(),
             cost: StepCost = StepCost(), tbt_deadline_ms: float = 50.0,
             max_prefill_tokens: int = 8192, max_num_seqs: int = 64, jitter: float = 0.05,
             seed: int = 0, num_blocks: int = 40_000) -> dict:
    """Run ``load`` through a fresh scheduler (16-token blocks, no prefix cache).

    Args:
        policy: a ``--scheduling-policy`` name (2 s age cap), or a factory given the clock.
        jitter: sigma of the log-normal factor on every step's cost.

    Returns:
        Seconds: the chats' time between tokens (``chat_tbt_p50``, ``_p99``, ``_max``) and
        TTFT (``chat_ttft_p50``, ``_p99``), the long prompts' largest TTFT (``long_ttft_max``).
    """
    clock, rng = SimClock(), np.random.default_rng(seed)
    if isinstance(policy, str):
        policy = create_scheduling_policy(policy, tbt_deadline_ms, 2000.0, clock)
    else:
        policy = policy(clock)
    sched = Scheduler(BlockManager(num_blocks, 16, False), max_num_seqs, max_num_seqs,
                      max_prefill_tokens, policy=policy)
    pending = load.arrivals()[::-1]
    arrival: dict[str, float] = {}
    times: dict[str, list[float]] = {}
    while pending or sched.running or sched.waiting:
        while pending and pending[-1][0] <= clock.now:
            t, rid, n, max_tokens = pending.pop()
            arrival[rid] = t
            sched.add(Sequence(rid, 0, [7] * n, SamplingParams(max_tokens=max_tokens), 0))
        out = sched.schedule()
        if not out.scheduled:
            clock.now = pending[-1][0]
            continue
        clock.now += cost(out) * float(rng.lognormal(0.0, jitter))
        sched.complete_step(out)
        for s in out.scheduled:
            if s.samples:
                s.seq.output_token_ids.append(1)
                times.setdefault(s.seq.request_id, []).append(clock.now)
                if len(s.seq.output_token_ids) >= s.seq.params.max_tokens:
                    sched.finish(s.seq)
    gaps = np.concatenate([np.diff(t) for rid, t in times.items() if rid.startswith("chat")])
    chat_ttft = [t[0] - arrival[rid] for rid, t in times.items() if rid.startswith("chat")]
    long_ttft = [t[0] - arrival[rid] for rid, t in times.items() if rid.startswith("long")]
    return {"chat_tbt_p50": float(np.percentile(gaps, 50)),
            "chat_tbt_p99": float(np.percentile(gaps, 99)), "chat_tbt_max": float(gaps.max()),
            "chat_ttft_p50": float(np.percentile(chat_ttft, 50)),
            "chat_ttft_p99": float(np.percentile(chat_ttft, 99)),
            "long_ttft_max": float(max(long_ttft))}
