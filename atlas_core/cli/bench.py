"""``atlas bench``: decode / prefill speed of a model (or a named random shape) on a backend."""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def add_parser(subparsers) -> argparse.ArgumentParser:
    from atlas_core.bench.shapes import SHAPES
    p = subparsers.add_parser("bench", help="measure decode/prefill speed and %% of roofline")
    p.add_argument("--model", default="tiny",
                   help="model directory, or a named shape with random weights built on the "
                        f"device: {', '.join(SHAPES)}")
    p.add_argument("--backend", default=None, help="GpuBackend name (default: best available)")
    p.add_argument("--on-disk", action="store_true",
                   help="named shapes: write a random checkpoint under the cache dir and load "
                        "it like a real model (default: fill the weights on the device)")
    p.add_argument("--prompt-len", type=int, default=512, help="prompt tokens for TTFT / prefill")
    p.add_argument("--decode-tokens", type=int, default=64, help="tokens generated per request")
    p.add_argument("--concurrency", default="1", help="comma-separated batch sizes, e.g. 1,32")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="overlap each decode step's host work with the previous step's device "
                        "work (default: on for backends with graphs)")
    p.add_argument("--copy-mb", type=int, default=1024, help="bytes for the copy-bandwidth probe")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                   help="fraction of device memory the engine may take (room left for prefill "
                        "workspace)")
    p.add_argument("--baseline", choices=["none", "hf"], default="none",
                   help="also time HF transformers first, in its own process (needs torch + a "
                        "CUDA GPU)")
    p.add_argument("--baseline-decode-tokens", type=int, default=None,
                   help="tokens per request for the baseline (default: --decode-tokens)")
    p.add_argument("--baseline-timeout", type=float, default=600.0,
                   help="seconds before the baseline is given up (recorded as an error)")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE ('-': stdout)")
    return p


def _model(name: str, on_disk: bool) -> tuple[str | None, dict]:
    """(checkpoint directory or None for an in-memory random model, its config)."""
    import json

    from atlas_core import env
    from atlas_core.bench.checkpoint import write_random_checkpoint
    from atlas_core.bench.shapes import SHAPES, shape_config
    if name not in SHAPES:
        path = Path(name)
        if not (path / "config.json").is_file():
            from atlas_core.cli import UserError
            raise UserError(f"--model {name!r} is neither a named shape ({', '.join(SHAPES)}) "
                            "nor a directory with config.json")
        return str(path), json.loads((path / "config.json").read_text())
    config = shape_config(name)
    if not on_disk:
        return None, config
    return str(write_random_checkpoint(config, env.cache_dir() / "bench" / name)), config


def _progress(msg: str) -> None:
    import sys
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _engine(args, path: str | None, config: dict, concurrency: list[int]):
    from atlas_core.engine import EngineArgs, LLMEngine
    engine_args = EngineArgs(model=path, backend=args.backend, max_num_seqs=max(concurrency),
                             max_prefill_tokens=max(args.prompt_len, 128),
                             max_seq_len=args.prompt_len + args.decode_tokens + 256,
                             enable_prefix_caching=False,
                             gpu_memory_utilization=args.gpu_memory_utilization,
                             async_scheduling=getattr(args, "async_scheduling", None))
    if path is not None:
        return LLMEngine.from_args(engine_args)
    from atlas_core.bench.random_model import build_random_model
    from atlas_core.engine.loading import create_backend
    backend, registry = create_backend(args.backend)
    model = build_random_model(config, backend, registry)
    return LLMEngine(model, backend, engine_args)


def run(args) -> int:
    from atlas_core.bench import report
    from atlas_core.bench.runner import BenchResult, copy_bandwidth, measure
    concurrency = [int(c) for c in args.concurrency.split(",") if c]
    _progress(f"preparing {args.model}")
    path, config = _model(args.model, args.on_disk)
    baseline = {}
    if args.baseline == "hf":
        from atlas_core.bench.baseline import run_isolated
        _progress("HF transformers baseline (own process)")
        spec = {"path": path, "config": None if path else config, "concurrency": concurrency,
                "decode_tokens": args.baseline_decode_tokens or args.decode_tokens,
                "prompt_len": args.prompt_len}
        baseline = run_isolated(spec, args.baseline_timeout)
        _progress(f"baseline: {baseline}")
    _progress(f"loading {path or 'random weights on the device'}")
    start = time.perf_counter()
    engine = _engine(args, path, config, concurrency)
    backend = engine.backend
    cold = time.perf_counter() - start
    info = backend.device_info()
    _progress(f"loaded in {cold:.1f} s; measuring")
    bw = copy_bandwidth(backend, args.copy_mb << 20)
    ttft, prefill, decode = measure(engine, config, prompt_len=args.prompt_len,
                                    decode_tokens=args.decode_tokens, concurrency=concurrency,
                                    bandwidth_gbs=bw, log=_progress)
    result = BenchResult(args.model, backend.name, info.name, bw, cold, args.prompt_len, ttft,
                         prefill, decode, baseline)
    print(report.to_text(result))
    if args.json:
        text = report.to_json(result)
        print(text) if args.json == "-" else Path(args.json).write_text(text)
    return 0
