"""Where a decode step's device time goes: build a named bench shape with random weights, capture
its decode graph (batch 1, or ``--batch B`` sequences), time the replay with events, then replay
it once between ``cuProfilerStart``/``cuProfilerStop`` so ``ncu --profile-from-start off`` times
every kernel node.

    ncu --profile-from-start off --graph-profiling node --clock-control none \\
        --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \\
        python scripts/decode_profile.py qwen3-8b > prof.csv
    python scripts/decode_profile.py --summarize prof.csv --graph-ms 4.1 --layers 36

The summary lists per kernel name: launches, summed duration and DRAM bytes, achieved GB/s; the
sum of kernel durations beside the graph replay time is the time lost between kernels.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict

import numpy as np


def batch_graph(model, backend, batch: int, context: int):
    """The decode graph of ``batch`` sequences after ``context``-token prompts (built only from
    engine APIs older trees share, so an A/B can run this file on a copy of an old commit)."""
    from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
    longest = context + 384
    engine = LLMEngine(model, backend, EngineArgs(
        model=None, max_num_seqs=batch, max_prefill_tokens=max(context, 2048),
        max_seq_len=longest, num_kv_blocks=batch * -(-longest // 16) + 8,
        enable_prefix_caching=False))
    rng = np.random.default_rng(0)  # random prompts: MoE routing spread as in `atlas bench`
    for i in range(batch):
        engine.add_request(f"r{i}", rng.integers(0, model.vocab_size, context).tolist(),
                           SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    bucket = min(b for b in engine.runner.graphs if b >= batch)
    return engine, engine.runner.graphs[bucket][0]


def engine_steps_ms(engine, batch: int, context: int, steps: int) -> float:
    """Median wall-clock ms of ``engine.step()`` over ``steps`` steps that decode all ``batch``
    sequences (same prompts as :func:`batch_graph`, greedy, so two trees decode the same
    tokens and route them to the same experts)."""
    import time

    from atlas_core.engine import SamplingParams
    rng = np.random.default_rng(0)
    for i in range(batch):
        engine.add_request(f"e{i}", rng.integers(0, engine.model.vocab_size, context).tolist(),
                           SamplingParams(temperature=0, max_tokens=steps + 8, ignore_eos=True))
    stamps = []
    while engine.has_unfinished_requests():
        outs = engine.step()
        if len(outs) == batch and all(o.outputs[0].token_ids for o in outs):
            stamps.append(time.perf_counter())
    gaps = np.diff(stamps[1:-2])
    return float(np.median(gaps) * 1e3)


def run(model_name: str, reps: int, context: int, batch: int, steps: int) -> None:
    from cuda.bindings import driver

    from atlas_core.bench.graph_timing import replay_ms
    from atlas_core.bench.random_model import build_random_model
    from atlas_core.bench.shapes import shape_config
    from atlas_core.engine.loading import create_backend
    backend, registry = create_backend("cuda")
    model = build_random_model(shape_config(model_name), backend, registry)
    _engine, graph = batch_graph(model, backend, batch, context)
    ms = replay_ms(backend, graph, reps)
    print(f"# {model_name}: batch {batch} graph replay {ms:.3f} ms median of {reps}, "
          f"{model.num_layers} layers", file=sys.stderr)
    if steps:
        ms = engine_steps_ms(_engine, batch, context, steps)
        print(f"# {model_name}: batch {batch} engine step {ms:.3f} ms median of {steps}",
              file=sys.stderr)
    driver.cuProfilerStart()
    graph.replay()
    backend.synchronize()
    driver.cuProfilerStop()


def summarize(path: str, graph_ms: float | None, layers: int | None, first: int) -> None:
    rows = []
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    for rec in csv.DictReader(lines):
        rows.append(rec)
    per_id: dict[str, dict] = defaultdict(dict)
    order: list[str] = []
    for rec in rows:
        key = rec["ID"]
        if key not in per_id:
            order.append(key)
        d = per_id[key]
        d["name"] = rec["Kernel Name"].split("(")[0]
        d["grid"] = rec.get("Grid Size", "")
        unit, val = rec["Metric Unit"], float(rec["Metric Value"].replace(",", ""))
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
                 "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1.0)
        d[rec["Metric Name"]] = val * scale
    agg: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for key in order:
        d = per_id[key]
        a = agg[d["name"]]
        a[0] += 1
        a[1] += d.get("gpu__time_duration.sum", 0.0)
        a[2] += d.get("dram__bytes_read.sum", 0.0)
    total_us = sum(a[1] for a in agg.values())
    total_b = sum(a[2] for a in agg.values())
    print(f"{'kernel':44s} {'n':>5s} {'us':>9s} {'us/each':>8s} {'MB':>9s} {'GB/s':>7s} {'%time':>6s}")
    for name, (n, us, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        gbs = b / (us * 1e3) if us else 0.0
        print(f"{name[:44]:44s} {n:5d} {us:9.1f} {us / n:8.2f} {b / 1e6:9.1f} {gbs:7.0f} "
              f"{100 * us / total_us:6.1f}")
    print(f"kernels {len(order)}, summed duration {total_us / 1e3:.3f} ms, DRAM read "
          f"{total_b / 1e9:.3f} GB ({total_b / (total_us * 1e3):.0f} GB/s over kernel time)")
    if graph_ms:
        print(f"graph replay {graph_ms:.3f} ms: {graph_ms - total_us / 1e3:+.3f} ms outside "
              f"kernel durations ({1e3 * (graph_ms - total_us / 1e3) / len(order):.2f} us per node)")
    if layers:
        print(f"per layer: {len(order) / layers:.1f} kernels, {total_us / layers:.1f} us")
    print(f"first {first} kernels in order:")
    for key in order[:first]:
        d = per_id[key]
        print(f"  {d['name'][:50]:50s} grid {d['grid']:>14s} {d.get('gpu__time_duration.sum', 0):7.2f} us "
              f"{d.get('dram__bytes_read.sum', 0) / 1e6:8.2f} MB")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=0,
                   help="also time this many engine.step() calls decoding the whole batch")
    p.add_argument("--summarize")
    p.add_argument("--graph-ms", type=float)
    p.add_argument("--layers", type=int)
    p.add_argument("--first", type=int, default=30)
    a = p.parse_args()
    if a.summarize:
        summarize(a.summarize, a.graph_ms, a.layers, a.first)
    else:
        run(a.model, a.reps, a.context, a.batch, a.steps)


if __name__ == "__main__":
    main()
