"""Compare a tensor / expert parallel engine with one GPU on the same checkpoint.

Runs prompts through ``LLMEngine`` twice (``-tp 1``, then ``-tp N``): greedy tokens, and the
prompt logprobs (teacher-forced, so a near-tied token on random weights cannot derail the
comparison). Exit status 1 when the logprobs differ by more than ``--atol`` or fewer than
``--min-agree`` of the greedy tokens agree.

    python scripts/multigpu_compare.py MODEL_DIR -tp 2 [--ep] [--atol 0.1] [--backend cuda]
    python scripts/multigpu_compare.py --shape qwen3-8b -tp 2      # random weights, on disk
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams


def run(path: str, backend: str, tp: int, ep: bool, prompts: list[list[int]], tokens: int):
    start = time.perf_counter()
    engine = LLMEngine.from_args(EngineArgs(model=path, backend=backend, max_num_seqs=len(prompts),
                                            max_seq_len=256, enable_prefix_caching=False,
                                            gpu_memory_utilization=0.85,
                                            tensor_parallel_size=tp, enable_expert_parallel=ep))
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, prompt_logprobs=0)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    out = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                lps = [lp.logprob for lp in o.prompt_logprobs if lp is not None]
                out[o.request_id] = (list(o.outputs[0].token_ids), np.array(lps))
    if tp > 1:
        engine.runner.shutdown()
    print(f"tp={tp}{' ep' if ep else ''}: {time.perf_counter() - start:.1f} s", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", help="model directory")
    p.add_argument("--shape", help="a named bench shape written with random weights instead")
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=2)
    p.add_argument("--ep", action="store_true", help="--enable-expert-parallel")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--atol", type=float, default=0.1, help="prompt logprob tolerance (bf16)")
    p.add_argument("--min-agree", type=float, default=0.75,
                   help="fraction of greedy tokens that must agree (random weights tie often)")
    args = p.parse_args()
    path = args.model
    if args.shape:
        from atlas_core import env
        from atlas_core.bench.checkpoint import write_random_checkpoint
        from atlas_core.bench.shapes import shape_config
        path = str(write_random_checkpoint(shape_config(args.shape),
                                           env.cache_dir() / "bench" / args.shape))
    import json
    from pathlib import Path
    vocab = json.loads((Path(path) / "config.json").read_text())["vocab_size"]
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, min(vocab, 1000), n).tolist() for n in (37, 64, 5)]
    one = run(path, args.backend, 1, False, prompts, args.tokens)
    many = run(path, args.backend, args.tensor_parallel_size, args.ep, prompts, args.tokens)
    worst, agree, total = 0.0, 0, 0
    for key, (tokens, lps) in one.items():
        other_tokens, other_lps = many[key]
        worst = max(worst, float(np.abs(lps - other_lps).max()))
        agree += sum(a == b for a, b in zip(tokens, other_tokens))
        total += len(tokens)
    print(f"prompt logprobs: max |diff| {worst:.4f} (atol {args.atol}); greedy tokens agree "
          f"{agree}/{total}")
    return 0 if worst <= args.atol and agree >= args.min_agree * total else 1


if __name__ == "__main__":
    sys.exit(main())
