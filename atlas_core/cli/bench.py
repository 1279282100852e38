"""``atlas bench``: decode / prefill speed of a model (or a named random shape) on a backend."""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("bench", help="measure decode/prefill speed and %% of roofline")
    p.add_argument("--model", default="tiny",
                   help="model directory, or a named shape: qwen3-0.6b, qwen3-8b, qwen3-30b-a3b, "
                        "tiny, tiny-moe (random weights)")
    p.add_argument("--backend", default=None, help="GpuBackend name (default: best available)")
    p.add_argument("--prompt-len", type=int, default=512, help="prompt tokens for TTFT / prefill")
    p.add_argument("--decode-tokens", type=int, default=64, help="tokens generated per request")
    p.add_argument("--concurrency", default="1", help="comma-separated batch sizes, e.g. 1,32")
    p.add_argument("--copy-mb", type=int, default=1024, help="bytes for the copy-bandwidth probe")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                   help="fraction of device memory the engine may take (room left for prefill "
                        "workspace and the baseline)")
    p.add_argument("--baseline", choices=["none", "hf"], default="none",
                   help="also time HF transformers (needs torch + a CUDA GPU)")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE ('-': stdout)")
    return p


def _model_dir(name: str) -> tuple[str, dict]:
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
    path = write_random_checkpoint(config, env.cache_dir() / "bench" / name)
    return str(path), config


def _progress(msg: str) -> None:
    import sys
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(args) -> int:
    from atlas_core.bench import report
    from atlas_core.bench.runner import BenchResult, copy_bandwidth, measure
    from atlas_core.engine import EngineArgs, LLMEngine
    concurrency = [int(c) for c in args.concurrency.split(",") if c]
    _progress(f"preparing {args.model}")
    path, config = _model_dir(args.model)
    _progress(f"loading {path}")
    start = time.perf_counter()
    engine_args = EngineArgs(model=path, backend=args.backend, max_num_seqs=max(concurrency),
                             max_prefill_tokens=max(args.prompt_len, 128),
                             max_seq_len=args.prompt_len + args.decode_tokens + 256,
                             enable_prefix_caching=False,
                             gpu_memory_utilization=args.gpu_memory_utilization)
    engine = LLMEngine.from_args(engine_args)
    backend = engine.backend
    cold = time.perf_counter() - start
    info = backend.device_info()
    _progress(f"loaded in {cold:.1f} s; measuring")
    bw = copy_bandwidth(backend, args.copy_mb << 20)
    ttft, prefill, decode = measure(engine, config, prompt_len=args.prompt_len,
                                    decode_tokens=args.decode_tokens, concurrency=concurrency,
                                    bandwidth_gbs=bw, log=_progress)
    result = BenchResult(args.model, backend.name, info.name, bw, cold, args.prompt_len, ttft,
                         prefill, decode)
    if args.baseline == "hf":
        from atlas_core.bench.baseline import hf_decode
        import gc
        del engine, backend
        gc.collect()
        _progress("HF transformers baseline")
        result.baseline = hf_decode(path, concurrency, args.decode_tokens)
    print(report.to_text(result))
    if args.json:
        text = report.to_json(result)
        print(text) if args.json == "-" else Path(args.json).write_text(text)
    return 0
