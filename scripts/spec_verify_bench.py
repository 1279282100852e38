"""Cost of a speculative verify step and tokens/s at forced full acceptance, random weights.

    python scripts/spec_verify_bench.py --shape qwen3.5-35b-a3b --backend cuda --batch 1 8 32
    python scripts/spec_verify_bench.py --shape tiny-qwen3.5-moe --backend numpy   # smoke run

Plain decode rows and verify rows (K + 1 rows a sequence) take other kernels by default, so with
random bf16 weights a greedy token can flip on a near tie and the check below can report a
difference that is rounding, not a bug: ``--batch-invariant`` (one code path per op) makes the
comparison exact, and ``--eager-verify`` tells the graph path from the verify logic.

For each batch: plain greedy decoding of random prompts, then the same requests with K drafts
per step taken from the plain run's own output (every draft accepted: the forced-full-
acceptance test mode; the tokens are checked equal). Reports the mean decode-step time of
both, their ratio (verify step / plain step, K + 1 positions against 1) and the tokens/s ratio.
Graphs are captured before timing (a warm-up pass over the whole batch, and every verify
bucket); the last column counts the timed verify steps replayed from a graph (on a backend with
graphs every one should be).
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np

from atlas_core.bench.random_model import build_random_model
from atlas_core.bench.shapes import shape_config
from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
from atlas_core.engine.loading import create_backend
from atlas_core.testing.spec_drafts import ScriptedProposer


def decode(engine, prompts, max_tokens, proposer=None):
    """Greedy-decode ``prompts`` together; returns (outputs, decode seconds, decode steps)."""
    if proposer is not None:
        engine.speculator.proposer = proposer
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    seqs = [s for g in engine.groups.values() for s in g.seqs]
    while any(not s.output_token_ids for s in seqs):
        engine.step()
    engine.backend.synchronize()
    start, steps = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    engine.backend.synchronize()
    return [list(s.output_token_ids) for s in seqs], time.perf_counter() - start, steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen3.5-35b-a3b")
    p.add_argument("--backend", default=None)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--eager-verify", action="store_true",
                   help="verify steps op by op instead of from CUDA graphs")
    p.add_argument("--batch-invariant", action="store_true",
                   help="batch-invariant kernels (EngineArgs.batch_invariant): plain and "
                        "speculative tokens must then be equal bit for bit")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    args = p.parse_args()

    config = shape_config(args.shape)
    backend, registry = create_backend(args.backend)
    if args.batch_invariant:  # on the backend (EngineArgs refuses it with speculation), before
        backend.set_batch_invariant(True)  # the weights are made, as load_engine_parts does
    model = build_random_model(config, backend, registry)
    rng = np.random.default_rng(0)
    print(f"{args.shape} on {args.backend or 'default backend'}, K={args.k}, verify "
          f"{'eager' if args.eager_verify else 'graphs'}"
          f"{', batch-invariant' if args.batch_invariant else ''}")
    print("| batch | plain step ms | verify step ms | verify / plain | plain tok/s | "
          "forced-accept tok/s | tok/s ratio | graph verify steps |")
    print("|---|---|---|---|---|---|---|---|")
    for batch in args.batch:
        prompts = [rng.integers(0, config["vocab_size"], args.prompt_len).tolist()
                   for _ in range(batch)]
        seq_len = args.prompt_len + args.max_tokens + 16
        # an explicit cache size: the two engines share the backend, and one sized from free
        # memory would leave the next none
        common = dict(max_num_seqs=batch, max_seq_len=seq_len, enable_prefix_caching=False,
                      num_kv_blocks=batch * -(-seq_len // 16) + 16,
                      gpu_memory_utilization=args.gpu_memory_utilization)
        plain = LLMEngine(model, backend, EngineArgs(**common))
        decode(plain, prompts, 3)
        want, plain_s, plain_steps = decode(plain, prompts, args.max_tokens)
        del plain
        gc.collect()  # the plain engine's KV cache goes back before the next one sizes its own
        spec = {"method": "ngram", "num_speculative_tokens": args.k, "draft_token_cost": 0.0,
                "disable_by_batch_size": batch, "verify_graphs": not args.eager_verify}
        engine = LLMEngine(model, backend, EngineArgs(**common, speculative_config=spec))
        oracle = ScriptedProposer({tuple(pr): out for pr, out in zip(prompts, want)},
                                  model.vocab_size, wrong_rate=0.0)
        engine.runner.warm_verify_graphs()
        decode(engine, prompts, 3, oracle)
        replays = engine.runner.num_verify_replays
        got, spec_s, spec_steps = decode(engine, prompts, args.max_tokens, oracle)
        replays = engine.runner.num_verify_replays - replays
        del engine
        gc.collect()
        if got != want:  # report where, and time it anyway: drafts past that point get rejected
            first = min(next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), len(w))
                        for g, w in zip(got, want))
            same = sum(g == w for g, w in zip(got, want))
            print(f"batch {batch}: speculative output differs from plain decoding in "
                  f"{batch - same} of {batch} sequences (first at token {first}); the timing "
                  "below is not at forced full acceptance past that token")
        tokens = batch * (args.max_tokens - 1)
        plain_ms, spec_ms = 1e3 * plain_s / plain_steps, 1e3 * spec_s / spec_steps
        print(f"| {batch} | {plain_ms:.2f} | {spec_ms:.2f} | {spec_ms / plain_ms:.2f} | "
              f"{tokens / plain_s:.1f} | {tokens / spec_s:.1f} | {plain_s / spec_s:.2f} | "
              f"{replays}/{spec_steps} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
