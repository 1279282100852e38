"""``atlas bench``: decode / prefill speed of a model (or a named random shape) on a backend,
over a matrix of batch sizes x context lengths, beside optional baselines."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

BASELINES = ("hf", "compiled")


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of positive integers (e.g. 1,8,32)")
    return sorted(set(values))


def _baselines(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip() and n.strip() != "none"]
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown baseline {', '.join(unknown)}; use hf, compiled, both (hf,compiled) or none")
    return list(dict.fromkeys(names))


def add_parser(subparsers) -> argparse.ArgumentParser:
    from atlas_core.bench.shapes import SHAPES
    p = subparsers.add_parser("bench", help="measure decode/prefill speed and %% of the floor")
    p.add_argument("--model", default="tiny",
                   help="model directory, or a named shape with random weights built on the "
                        f"device: {', '.join(SHAPES)} (default: %(default)s)")
    p.add_argument("--backend", default=None, help="GpuBackend name (default: best available)")
    p.add_argument("--on-disk", action="store_true",
                   help="named shapes: write a random checkpoint under the cache dir and load "
                        "it like a real model (default: fill the weights on the device; with "
                        "-tp every rank fills its own shard, --load-format dummy)")
    p.add_argument("--batch", "--concurrency", dest="batch", type=_int_list, default=[1],
                   help="comma-separated batch sizes, e.g. 1,8,32 (default: 1)")
    p.add_argument("--context", "--prompt-len", dest="context", type=_int_list, default=[512],
                   help="comma-separated context lengths: each cell prefills prompts of this "
                        "many tokens and times decode at that context (default: 512)")
    p.add_argument("--decode-tokens", type=int, default=64,
                   help="tokens generated per request (default: %(default)s)")
    p.add_argument("--max-prefill-tokens", type=int, default=None,
                   help="prefill chunk size of the engine (default: the longest context, at "
                        "most 16384)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="overlap each decode step's host work with the previous step's device "
                        "work (default: on for backends with graphs)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="time the engine in batch-invariant mode (EngineArgs.batch_invariant; "
                        "docs/serving.md, Determinism; default: off)")
    p.add_argument("--copy-mb", type=int, default=1024,
                   help="MiB for the copy-bandwidth probe (default: %(default)s)")
    p.add_argument("--bandwidth", type=float, default=None,
                   help="memory bandwidth in GB/s for the floor (default: the copy probe)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                   help="fraction of device memory the engine may take (room left for prefill "
                        "workspace; default: %(default)s)")
    p.add_argument("--baseline", type=_baselines, default=[],
                   help="comma list of baselines timed first, each in its own process at the "
                        "same cells: hf (transformers eager), compiled (plain PyTorch with a "
                        "static KV cache under torch.compile); need torch (default: none)")
    p.add_argument("--baseline-mode", choices=["compile", "eager"], default="compile",
                   help="compiled baseline: torch.compile(mode='reduce-overhead', "
                        "fullgraph=True) or eager (default: %(default)s)")
    p.add_argument("--baseline-decode-tokens", type=int, default=None,
                   help="tokens per request for the baselines (default: --decode-tokens)")
    p.add_argument("--baseline-timeout", type=float, default=600.0,
                   help="seconds before a baseline is given up (recorded as an error; "
                        "default: %(default)s)")
    p.add_argument("--image-size", type=int, default=1024, metavar="PIXELS",
                   help="vision-language models: side of the square image whose encode time "
                   "and image + 100-token TTFT are reported (default 1024)")
    p.add_argument("--json", metavar="FILE",
                   help="write the results as JSON to FILE ('-': stdout; default: text only)")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, metavar="N",
                   help="split the model over N GPUs (worker processes; a named shape is built "
                   "by every rank from its config, random weights on its own GPU, nothing "
                   "written to disk unless --on-disk); GB/step and the floor are then per rank "
                   "(default 1)")
    p.add_argument("--enable-expert-parallel", action="store_true",
                   help="with -tp: whole experts per GPU (MoE models; default: a slice of every "
                   "expert)")
    p.add_argument("--kv-cache-dtype", choices=["auto", "bf16", "fp8", "nvfp4"], default="auto",
                   help="KV cache dtype (default auto: the model's dtype)")
    p.add_argument("--kv-high-precision-layers", default="auto", metavar="auto|none|LIST",
                   help="with fp8/nvfp4 KV: layers kept in the model dtype (default auto)")
    p.add_argument("--csv", metavar="FILE",
                   help="write one row per engine and cell as CSV to FILE ('-': stdout; "
                        "default: none)")
    return p


def _model(name: str, on_disk: bool, parallel: bool = False) -> tuple[str | None, dict]:
    """(checkpoint directory or None for an in-memory random model, its config). A named
    shape split over workers (``parallel``, not ``on_disk``) gets a directory holding its
    config.json only: each worker reads it and fills its shard (``--load-format dummy``)."""
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
    if on_disk:
        return str(write_random_checkpoint(config, env.cache_dir() / "bench" / name)), config
    if parallel:
        path = env.cache_dir() / "bench" / f"{name}-config-only"
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config, indent=2))
        return str(path), config
    return None, config


def _per_rank_random(args) -> bool:
    """A named shape split over workers without --on-disk: every rank fills its own shard
    (``--load-format dummy``)."""
    from atlas_core.bench.shapes import SHAPES
    return args.tensor_parallel_size > 1 and args.model in SHAPES and not args.on_disk


def _progress(msg: str) -> None:
    import sys
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _engine(args, path: str | None, config: dict):
    """An engine for the whole matrix: KV sized for the longest cell when it fits, else what
    memory allows (the cells that do not fit are skipped, not run)."""
    from atlas_core.engine import EngineArgs, LLMEngine
    from atlas_core.engine.loading import create_backend, load_engine_parts
    from atlas_core.bench.runner import lead_tokens
    from atlas_core.bench.vision import image_prompt_len
    prefill = args.max_prefill_tokens or max(128, min(max(args.context), 16384))
    lead = lead_tokens(prefill, max(args.batch), max(args.context))
    longest = max(max(args.context) + args.decode_tokens + lead,
                  image_prompt_len(config, args.image_size)) + 16
    model_max = int(config.get("max_position_embeddings") or longest)
    fields = dict(model=path, backend=args.backend, max_num_seqs=max(args.batch),
                  max_prefill_tokens=prefill, enable_prefix_caching=False,
                  gpu_memory_utilization=args.gpu_memory_utilization,
                  async_scheduling=args.async_scheduling,
                  batch_invariant=getattr(args, "batch_invariant", False),
                  kv_cache_dtype=getattr(args, "kv_cache_dtype", "auto"),
                  kv_high_precision_layers=getattr(args, "kv_high_precision_layers", "auto"))
    if args.tensor_parallel_size > 1:
        return LLMEngine.from_args(EngineArgs(
            **fields, max_seq_len=min(longest, model_max),
            tensor_parallel_size=args.tensor_parallel_size,
            enable_expert_parallel=args.enable_expert_parallel,
            load_format="dummy" if _per_rank_random(args) else "auto"))
    if path is not None:
        parts = load_engine_parts(EngineArgs(**fields))
        backend, model = parts.backend, parts.model
    else:
        from atlas_core.bench.random_model import build_random_model
        backend, registry = create_backend(args.backend)
        if fields["batch_invariant"]:
            backend.set_batch_invariant(True)
        model = build_random_model(config, backend, registry)
    try:
        return LLMEngine(model, backend, EngineArgs(**fields, max_seq_len=min(longest, model_max)))
    except ValueError as exc:
        _progress(f"the longest cell does not fit ({exc}); sizing the KV cache from memory")
        return LLMEngine(model, backend, EngineArgs(**fields))


def _run_baselines(args, path: str | None, config: dict) -> dict:
    from atlas_core.bench.baseline import run_isolated
    decode = args.baseline_decode_tokens or args.decode_tokens
    model_max = int(config.get("max_position_embeddings") or 1 << 30)
    contexts = [c for c in args.context if c + decode < model_max]
    spec = {"path": path, "config": None if path else config, "batches": args.batch,
            "contexts": contexts, "mode": args.baseline_mode, "decode_tokens": decode}
    modules = {"hf": ("atlas_core.bench.baseline", "HF baseline"),
               "compiled": ("atlas_core.bench.torch_baseline", "compiled-PyTorch baseline")}
    out = {}
    for name in args.baseline:
        _progress(f"baseline {name} (own process)")
        out[name] = run_isolated(spec, args.baseline_timeout, *modules[name])
        _progress(f"baseline {name}: {out[name].get('error') or 'done'}")
    return out


def _bandwidth(args, engine) -> tuple[float, str]:
    """``(GB/s, where it came from)`` of one GPU: ``--bandwidth``, else a copy probe (under
    ``-tp`` on rank 0's device, through its worker; the known figure of the device when that
    probe fails; 0 when neither is known)."""
    from atlas_core.bench.floor import copy_bandwidth, known_bandwidth
    if args.bandwidth:
        return args.bandwidth, "--bandwidth"
    if args.tensor_parallel_size == 1:
        return copy_bandwidth(engine.backend, args.copy_mb << 20), "measured copy, read + write"
    gbs, how = engine.runner.probe_bandwidth(args.copy_mb << 20)
    if gbs:
        return gbs, f"rank 0's device, {how}"
    name = engine.backend.device_info().name
    known = known_bandwidth(name)
    if known:
        return known, f"the known figure of {name}; {how} on rank 0"
    return 0.0, f"{how} on rank 0 and {name} has no known figure; pass --bandwidth"


def _write(target: str | None, text: str) -> None:
    if target:
        print(text) if target == "-" else Path(target).write_text(text)


def run(args) -> int:
    from atlas_core.bench import report
    from atlas_core.bench.runner import BenchResult, kv_note, measure
    from atlas_core.bench.shapes import shape_note
    from atlas_core.cli import UserError
    if args.decode_tokens < 4:
        raise UserError(f"--decode-tokens {args.decode_tokens} is too few to time decode steps; "
                        "use 4 or more")
    _progress(f"preparing {args.model}")
    parallel = args.tensor_parallel_size > 1
    path, config = _model(args.model, args.on_disk, parallel)
    dummy = _per_rank_random(args)
    # a config-only directory holds no weights: the baselines build the shape themselves
    baselines = _run_baselines(args, None if dummy else path, config)
    _progress("loading " + ("random weights, each rank its shard on its own device" if dummy
                            else path or "random weights on the device"))
    start = time.perf_counter()
    engine = _engine(args, path, config)
    cold = time.perf_counter() - start
    info = engine.backend.device_info()
    _progress(f"loaded in {cold:.1f} s; measuring")
    bw, source = _bandwidth(args, engine)
    cells = measure(engine, batches=args.batch, contexts=args.context,
                    decode_tokens=args.decode_tokens, bandwidth_gbs=bw, log=_progress)
    describe = getattr(engine.backend, "matmul_library", None)
    result = BenchResult(args.model, engine.backend.name, info.name, bw, source, cold,
                         args.decode_tokens, cells, baselines,
                         per_rank=args.tensor_parallel_size if parallel else 0,
                         matmul=describe() if callable(describe) else "",
                         shape=shape_note(args.model, config) if config else "",
                         kv=kv_note(getattr(engine, "kv_config", None)))
    print(report.to_text(result))
    from atlas_core.bench.vision import measure_vision, takes_images
    if takes_images(engine.model):
        print(measure_vision(engine, args.image_size, log=_progress).to_text())
    _write(args.json, report.to_json(result))
    _write(args.csv, report.to_csv(result))
    failed = [c for c in cells if c["status"].startswith("failed")]
    if failed:
        print(f"error: {len(failed)} of {len(cells)} cells failed (their rows say why)")
        return 1
    return 0
