"""Device time of one batch-1 decode step: the captured decode graph of a named bench shape,
replayed alone and timed with events (no scheduling, sampling sync or other host work), to set
beside ``atlas bench``'s wall-clock step time.

    python scripts/decode_graph_time.py qwen3-30b-a3b [--gpu-memory-utilization 0.85]
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--backend", default=None)
    args = parser.parse_args()
    from atlas_core.bench.graph_timing import decode_graph, replay_ms
    from atlas_core.bench.random_model import build_random_model
    from atlas_core.bench.shapes import shape_config
    from atlas_core.engine.loading import create_backend
    backend, registry = create_backend(args.backend)
    model = build_random_model(shape_config(args.model), backend, registry)
    _engine, graph = decode_graph(model, backend, 128, num_kv_blocks=None,
                                  gpu_memory_utilization=args.gpu_memory_utilization)
    ms = replay_ms(backend, graph, args.reps)
    layers = model.num_layers
    print(f"{args.model}: decode graph replay {ms:.3f} ms (median of {args.reps}), "
          f"{1e3 * ms / layers:.1f} us per layer over {layers} layers")


if __name__ == "__main__":
    main()
