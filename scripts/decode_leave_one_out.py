"""In-graph cost of each kernel family of a batch-1 decode step: capture the decode graph with
every launch of one family left out (its outputs stay whatever the workspace held, which only
changes values, never shapes or indices: routing and sampling always pick valid ids), time the
replay, and report the difference to the full graph. Unlike ncu's isolated per-kernel times this
includes what PDL overlap hides and what each kernel boundary costs.

    python scripts/decode_leave_one_out.py qwen3-8b [--families rope_qkv,attn_dec,...] [--prompt 4096]
"""

from __future__ import annotations

import argparse
from collections import Counter


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--families", default="")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens (context of the step)")
    p.add_argument("--tp", type=int, default=1,
                   help="time rank 0 of a TP=N split, collectives left out (bench/rank_model)")
    p.add_argument("--ep", action="store_true", help="with --tp: expert parallel")
    a = p.parse_args()
    from atlas_core.bench.graph_timing import decode_graph, replay_ms
    from atlas_core.bench.random_model import build_random_model
    from atlas_core.bench.rank_model import build_rank_model
    from atlas_core.bench.shapes import shape_config
    from atlas_core.engine.loading import create_backend
    from atlas_cuda.kernels_loader import KernelLibrary, kernel_family
    # hooked on the class: a backend re-binds its kernel library per model (bind_model), so
    # hooks on the instance made before the model is built would be lost
    names: dict[int, str] = {}
    kernel, launch = KernelLibrary.kernel, KernelLibrary.launch

    def named_kernel(self, module, variant, name, *args, **kw):
        k = kernel(self, module, variant, name, *args, **kw)
        names[id(k)] = kernel_family(name)
        return k

    skip: set[str] = set()
    seen: Counter = Counter()

    def filtered_launch(self, k, *args, **kw):
        fam = names.get(id(k), "?")
        seen[fam] += 1
        if fam not in skip:
            launch(self, k, *args, **kw)

    KernelLibrary.kernel, KernelLibrary.launch = named_kernel, filtered_launch
    be, registry = create_backend("cuda")
    model = (build_rank_model(shape_config(a.model), be, registry, a.tp, a.ep) if a.tp > 1
             else build_random_model(shape_config(a.model), be, registry))

    def graph_time(families: set[str]) -> float:
        skip.clear()
        skip.update(families)
        seen.clear()
        engine, graph = decode_graph(model, be, a.prompt)
        ms = replay_ms(be, graph, a.reps)
        skip.clear()
        del engine
        return ms

    full = graph_time(set())
    layers = model.num_layers
    print(f"{a.model}: full decode graph {full:.3f} ms ({1e3 * full / layers:.1f} us/layer)")
    fams = [f for f in a.families.split(",") if f] or sorted(
        f for f in seen if f not in ("?",))
    for fam in fams:
        ms = graph_time({fam})
        print(f"  without {fam:34s} {ms:.3f} ms  saves {1e3 * (full - ms):7.1f} us/step "
              f"({1e3 * (full - ms) / layers:5.2f} us/layer, {seen.get(fam, 0)} launches seen)")


if __name__ == "__main__":
    main()
