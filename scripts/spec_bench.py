"""Speculative decoding: acceptance and speed against plain decoding, on any backend.

    python scripts/spec_bench.py                              # demo model, numpy, batch 1
    python scripts/spec_bench.py --model DIR --backend cuda --prompts code --batch 1 8 32
    python scripts/spec_bench.py --methods mtp ngram --repeat 2   # the demo model's MTP head

Methods: ``ngram`` (prompt lookup), ``mtp`` (the checkpoint's head, when it has one) and
``oracle`` (drafts from the plain run's own output: every draft is accepted, the forced-full-
acceptance test mode; the tokens stay exact). Every speculative run is checked token for token
against the plain run; each row's speedup is against plain runs timed alternately with its
own. Prints one markdown table (docs/serving.md quotes it): ``tok/s`` over
whole requests (prefill included), ``decode tok/s`` over the steps in which every running
sequence was past its prefill (output tokens after the first).
"""

from __future__ import annotations

import argparse
import json
import time

from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
from atlas_core.testing.spec_drafts import ScriptedProposer

DEMO_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
DEMO = [
    ([{"role": "user", "content": f"What's the weather in {city}?"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
          "name": "get_weather", "arguments": {"city": city}}}]},
      {"role": "tool", "content": json.dumps({"city": city, "temperature": t, "unit": "celsius",
                                              "condition": c})}], DEMO_TOOLS)
    for city, t, c in (("Paris", 18, "sunny"), ("Lisbon", 21, "cloudy"), ("Oslo", 3, "snowy"),
                       ("Cairo", 33, "sunny"))
] + [([{"role": "user", "content": q}], None) for q in (
    "What is 482 + 39?", "What is the capital of Japan?", "Compute 17 minus 905",
    "What's the weather in Rome?")]
CODE = """def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax


def describe(items):
    lines = []
    for item in items:
        lines.append(f"{item.name}: {item.quantity} x {item.price}")
    return "\\n".join(lines)
"""
CODE_PROMPTS = [([{"role": "user", "content": f"Rename `items` to `products` everywhere in this "
                                             f"code and return the whole file:\n\n{CODE}"}], None)]


def encode(engine, conversations):
    tok = engine.tokenizer
    return [tok.encode(tok.apply_chat_template(m, tools=t, add_generation_prompt=True))
            for m, t in conversations]


def generate(engine, prompts, params, batch, runs=2):
    """Run ``prompts`` ``batch`` at a time, ``runs`` times (the machine may be shared: the
    fastest run counts); returns (outputs by prompt index, seconds, seconds of the steps in
    which every running sequence was past its prefill)."""
    best, best_decode = float("inf"), float("inf")
    for _ in range(runs):
        outs, start, decode = {}, time.perf_counter(), 0.0
        for first in range(0, len(prompts), batch):
            for i in range(first, min(first + batch, len(prompts))):
                engine.add_request(str(i), prompts[i], params)
            while engine.has_unfinished_requests():
                is_decode = all(seq.output_token_ids for group in engine.groups.values()
                                for seq in group.seqs)
                step_start = time.perf_counter()
                outs.update((out.request_id, out) for out in engine.step() if out.finished)
                if is_decode:
                    decode += time.perf_counter() - step_start
        best = min(best, time.perf_counter() - start)
        best_decode = min(best_decode, decode)
    return [outs[str(i)].outputs[0].token_ids for i in range(len(prompts))], best, best_decode


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model directory (default: the demo model)")
    p.add_argument("--backend", default="numpy")
    p.add_argument("--prompts", choices=["demo", "code"], default="demo")
    p.add_argument("--repeat", type=int, default=1, help="copies of the prompt set")
    p.add_argument("--batch", type=int, nargs="+", default=[1])
    p.add_argument("--k", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--methods", nargs="+", default=["ngram", "oracle"])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=2,
                   help="timed runs per row, alternating with plain runs (the fastest counts)")
    p.add_argument("--draft-token-cost", type=float, default=None,
                   help="the gate's draft_token_cost (default: the config's; 0 always drafts K)")
    args = p.parse_args()

    base = dict(model=args.model, backend=args.backend, max_num_seqs=max(args.batch))
    plain = LLMEngine.from_args(EngineArgs(**base))
    prompts = encode(plain, DEMO if args.prompts == "demo" else CODE_PROMPTS) * args.repeat
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    generate(plain, prompts, params, max(args.batch), runs=1)
    print("| batch | method | K | tok/s | speedup | decode tok/s | decode speedup | acceptance "
          "| mean accepted length |")
    print("|---|---|---|---|---|---|---|---|---|")
    for batch in args.batch:
        want, seconds, decode_s = generate(plain, prompts, params, batch, args.runs)
        tokens = sum(len(t) for t in want)
        decode_tokens = tokens - len(prompts)
        print(f"| {batch} | plain | - | {tokens / seconds:.1f} | 1.00 | "
              f"{decode_tokens / decode_s:.1f} | 1.00 | - | 1.00 |")
        for method in args.methods:
            for k in args.k:
                spec = {"method": "mtp" if method == "mtp" else "ngram",
                        "num_speculative_tokens": k, "disable_by_batch_size": max(batch, 1)}
                if args.draft_token_cost is not None:
                    spec["draft_token_cost"] = args.draft_token_cost
                engine = LLMEngine.from_args(EngineArgs(**base, speculative_config=spec))
                if method == "oracle":
                    engine.speculator.proposer = ScriptedProposer(
                        {tuple(pr): out for pr, out in zip(prompts, want)},
                        engine.model.vocab_size, wrong_rate=0.0)
                generate(engine, prompts[:1], params, 1, runs=1)
                before = engine.stats().speculative
                got, secs, dsecs = generate(engine, prompts, params, batch, runs=1)
                if got != want:
                    raise SystemExit(f"{method} K={k}: output differs from plain decoding")
                st = engine.stats().speculative
                # plain and speculative runs alternate, so a shared machine's load hits both
                ref, dref = seconds, decode_s
                for _ in range(args.runs):
                    _, again, dagain = generate(plain, prompts, params, batch, runs=1)
                    ref, dref = min(ref, again), min(dref, dagain)
                    _, again, dagain = generate(engine, prompts, params, batch, runs=1)
                    secs, dsecs = min(secs, again), min(dsecs, dagain)
                drafted = st.num_draft_tokens - before.num_draft_tokens
                accepted = st.num_accepted_tokens - before.num_accepted_tokens
                steps = st.num_drafts - before.num_drafts
                rate = accepted / drafted if drafted else 0.0
                mean = (accepted + steps) / steps if steps else 1.0
                print(f"| {batch} | {method} | {k} | {tokens / secs:.1f} | "
                      f"{ref / secs:.2f} | {decode_tokens / dsecs:.1f} | "
                      f"{dref / dsecs:.2f} | {rate:.2f} | {mean:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
