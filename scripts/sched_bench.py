"""fifo vs slo scheduling on a real model: p99 time-between-tokens of short chats and TTFT of
long prompts under a mixed load (issue #31), in wall-clock time on the engine's backend.

Load: ``--chats`` streaming users, each with a ``--chat-prompt``-token prompt generating
``--chat-tokens`` tokens, arriving ``--chat-gap`` seconds apart and starting a new chat when one
ends, for ``--duration`` seconds; plus a ``--long-prompt``-token prompt (4 output tokens) every
``--long-every`` seconds. Prompts are random token ids (the same for both policies). Each
policy runs on a fresh engine after a warm-up request and a probe (one chat prompt alone: its
TTFT against its decode steps shows what a step with a prefill chunk costs over a graph
decode step); one JSON line per policy.

    python scripts/sched_bench.py MODEL [--backend cuda] [--tbt-deadline-ms 50]

MODEL: a checkpoint directory, or a named bench shape (random weights on the device).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from atlas_core.bench.random_model import engine_for
from atlas_core.engine import SamplingParams


def build_load(args, vocab: int) -> list[tuple[float, str, list[int], int]]:
    rng = np.random.default_rng(0)
    load = []
    per_user = args.chat_tokens * 0.03 + 0.5
    for user in range(args.chats):
        t = user * args.chat_gap
        i = 0
        while t < args.duration:
            prompt = rng.integers(100, vocab - 100, args.chat_prompt).tolist()
            load.append((t, f"chat{user}-{i}", prompt, args.chat_tokens))
            t += per_user
            i += 1
    t, i = args.long_first, 0
    while t < args.duration:
        load.append((t, f"long{i}", rng.integers(100, vocab - 100, args.long_prompt).tolist(), 4))
        t += args.long_every
        i += 1
    return sorted(load, key=lambda x: x[0])


def probe(engine, args, vocab: int) -> tuple[float, float]:
    """One chat prompt alone, twice (the second is reported): its TTFT (ms) is one eager step
    (a prefill chunk: no decode graph) and the median gap between its next tokens (ms) one
    graph decode step; their difference, less the prompt's tokens, is the eager cost that
    ``atlas_core.testing.sched_sim.StepCost.eager`` models (fitted: ~27 ms on the H200)."""
    rng = np.random.default_rng(1)
    result = (0.0, 0.0)
    for i in range(2):
        prompt = rng.integers(100, vocab - 100, args.chat_prompt).tolist()
        engine.add_request(f"probe{i}", prompt, SamplingParams(temperature=0.0, max_tokens=17,
                                                                ignore_eos=True))
        stamps: list[float] = []
        start = time.perf_counter()
        while engine.has_unfinished_requests():
            for out in engine.step():
                stamps.extend([time.perf_counter()] * (len(out.outputs[0].token_ids) - len(stamps)))
        result = ((stamps[0] - start) * 1e3, float(np.median(np.diff(stamps))) * 1e3)
    return result


def run_policy(args, policy: str) -> dict:
    engine = engine_for(args.model, args.backend, max_num_seqs=args.max_num_seqs,
                        max_prefill_tokens=args.max_prefill_tokens, scheduling_policy=policy,
                        tbt_deadline_ms=args.tbt_deadline_ms, enable_prefix_caching=False,
                        max_seq_len=max(args.long_prompt, args.chat_prompt + args.chat_tokens) + 64,
                        gpu_memory_utilization=args.gpu_memory_utilization)
    vocab = engine.model.vocab_size
    engine.add_request("warmup", list(range(100, 164)), SamplingParams(max_tokens=8))
    while engine.has_unfinished_requests():
        engine.step()
    probe_ttft, probe_step = probe(engine, args, vocab)
    load = build_load(args, vocab)
    times: dict[str, list[float]] = {}
    arrival: dict[str, float] = {}
    start = time.perf_counter()
    pending = list(load)
    while pending or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while pending and pending[0][0] <= now:
            t, rid, prompt, max_tokens = pending.pop(0)
            arrival[rid] = now
            engine.add_request(rid, prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                           ignore_eos=True))
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0][0] - now))
            continue
        for out in engine.step():
            got = times.setdefault(out.request_id, [])
            stamp = time.perf_counter() - start
            got.extend([stamp] * (len(out.outputs[0].token_ids) - len(got)))
    gaps = np.concatenate([np.diff(t) for r, t in times.items() if r.startswith("chat") and len(t) > 1])
    ttft = [times[r][0] - arrival[r] for r in times if r.startswith("long")]
    chat_ttft = [times[r][0] - arrival[r] for r in times if r.startswith("chat")]
    return {"policy": policy, "device": getattr(engine.backend, "name", args.backend),
            "chat_tbt_p50_ms": float(np.percentile(gaps, 50) * 1e3),
            "chat_tbt_p99_ms": float(np.percentile(gaps, 99) * 1e3),
            "chat_tbt_max_ms": float(gaps.max() * 1e3),
            "chat_gaps_over_30ms_pct": float(np.mean(gaps > 0.030) * 100),
            "chat_ttft_p50_ms": float(np.percentile(chat_ttft, 50) * 1e3),
            "chat_ttft_p99_ms": float(np.percentile(chat_ttft, 99) * 1e3),
            "long_ttft_max_s": float(max(ttft)) if ttft else None,
            "long_prompts": len(ttft), "chats": len(chat_ttft),
            "alone_chat_ttft_ms": probe_ttft, "alone_decode_step_ms": probe_step}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--backend", default=None)
    p.add_argument("--policies", default="fifo,slo")
    p.add_argument("--tbt-deadline-ms", type=float, default=50.0)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-prefill-tokens", type=int, default=8192)
    p.add_argument("--chats", type=int, default=30)
    p.add_argument("--chat-prompt", type=int, default=200)
    p.add_argument("--chat-tokens", type=int, default=128)
    p.add_argument("--chat-gap", type=float, default=0.1)
    p.add_argument("--long-prompt", type=int, default=32768)
    p.add_argument("--long-first", type=float, default=2.0)
    p.add_argument("--long-every", type=float, default=10.0)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    args = p.parse_args()
    for policy in args.policies.split(","):
        print(json.dumps(run_policy(args, policy)), flush=True)


if __name__ == "__main__":
    main()
