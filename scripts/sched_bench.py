"""fifo vs slo scheduling on a real model: p99 time-between-tokens of short chats and TTFT of
long prompts under a mixed load (issue #31), in wall-clock time on the engine's backend.

Load: ``--chats`` streaming users, each with a ``--chat-prompt``-token prompt generating
``--chat-tokens`` tokens, arriving ``--chat-gap`` seconds apart and starting a new chat when one
ends, for ``--duration`` seconds; plus a ``--long-prompt``-token prompt (4 output tokens) every
``--long-every`` seconds. Prompts are random token ids (the same for both policies). Each
policy runs on a fresh engine after a warm-up request; one JSON line per policy.

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
            "chat_ttft_p99_ms": float(np.percentile(chat_ttft, 99) * 1e3),
            "long_ttft_max_s": float(max(ttft)) if ttft else None,
            "long_prompts": len(ttft), "chats": len(chat_ttft)}


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
