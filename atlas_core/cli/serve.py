"""``atlas serve``: load a model and serve it over OpenAI- and Anthropic-compatible HTTP.

The HTTP listener starts at once (``/health`` answers 503 while the model loads in the
background); a model that fails to load stops the server with one clear line and exit code 1.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from atlas_core import env
from atlas_core.cli._agent_args import add_agent_arguments, agent_kwargs
from atlas_core.cli._arg_types import (add_model_arguments, parse_json_object, parse_name,
                                       parse_port, parse_seconds, parse_size)
from atlas_core.cli._parallel_args import add_parallel_arguments, is_worker_node, parallel_kwargs
from atlas_core.cli._serve_policies import add_policy_arguments, policy_kwargs
from atlas_core.cli._speculative import add_speculative_arguments, speculative_config

DEMO_NAME = "atlas-demo"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8888
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve", help="serve a model over OpenAI- and Anthropic-compatible HTTP",
        description="Serve MODEL (a local directory or Hugging Face id; default: the built-in "
                    "demo model) on http://HOST:PORT/v1. See docs/serving.md.")
    add_model_arguments(p, "model directory or Hugging Face id (default: the built-in demo model)")
    g = p.add_argument_group("model")
    g.add_argument("--served-model-name", "--model-name", action="append", default=None,
                   type=parse_name, metavar="NAME", help="name clients use in `model` (repeatable; the first is "
                   "reported; default: MODEL as given)")
    g.add_argument("--revision", default=None, help="Hub branch, tag or commit")
    g.add_argument("--cache-dir", "--download-dir", default=None,
                   help="where downloaded models are kept "
                   "(default: the Hugging Face cache)")
    g.add_argument("--backend", default=None, help="GpuBackend (default: ATLAS_BACKEND, else "
                   "cuda when a GPU is present, else numpy)")
    g.add_argument("--dtype", default=None, help="weight dtype override (bfloat16, float32, ...)")
    g.add_argument("--dequantize-weights", action="store_true",
                   help="load FP8 / NVFP4 weights dequantized to the model dtype (default: "
                        "kept quantized where the backend runs the format; "
                        "docs/quantization.md)")
    g.add_argument("--batch-invariant", action="store_true",
                   help="a request's tokens and logprobs do not depend on what else is in the "
                        "batch (evals, agent replay); slower on cuda (docs/serving.md, "
                        "Determinism; default: off)")
    g.add_argument("--seed", type=int, default=0, help="engine random seed (default 0)")
    g.add_argument("--load-format", choices=["auto", "dummy"], default="auto",
                   help="auto: read the checkpoint; dummy: build the model from config.json "
                   "alone with RANDOM weights made on each GPU (each rank its shard; nothing "
                   "read or written; outputs are meaningless: for speed tests of models the "
                   "disk cannot hold; docs/multi-gpu.md) (default auto)")
    e = p.add_argument_group("engine")
    e.add_argument("--max-num-seqs", type=int, default=64,
                   help="sequences running at once (default 64)")
    e.add_argument("--max-batch-size", type=int, default=None,
                   help="sequences per step (default: --max-num-seqs)")
    e.add_argument("--max-prefill-tokens", "--max-num-batched-tokens", type=int, default=2048,
                   help="prompt tokens per step; longer prompts are chunked (default 2048)")
    e.add_argument("--max-seq-len", "--max-model-len", type=int, default=None,
                   help="longest prompt + output "
                   "(default: the model's limit, capped by the KV cache)")
    e.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of device memory Atlas may use (default 0.9)")
    e.add_argument("--kv-cache-dtype", choices=["auto", "bf16", "fp8", "nvfp4"], default="auto",
                   help="KV cache dtype (default auto: the model's dtype; nvfp4: 4-bit, 3.5x bf16)")
    e.add_argument("--kv-high-precision-layers", default="auto", metavar="auto|none|LIST",
                   help="with fp8/nvfp4 KV: layers kept in the model dtype (default auto: the "
                        "first and last attention layer; or none, or indices like 0,35)")
    e.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the KV cache of shared prompt prefixes (default on)")
    e.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="prepare each decode step on the host while the device runs the previous "
                        "one (default: on for backends with graphs, e.g. cuda)")
    e.add_argument("--num-kv-blocks", type=int, default=None,
                   help="KV blocks to allocate (default: sized from memory)")
    e.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    e.add_argument("--max-waiting", type=int, default=None, help="requests allowed to wait for "
                   "a slot; more get HTTP 429 with Retry-After (default: unlimited)")
    add_kv_tier_arguments(p)
    s = p.add_argument_group("server")
    s.add_argument("--host", "--bind", default=None, metavar="ADDR",
                   help=f"address to listen on (default: ATLAS_HOST, else {DEFAULT_HOST}, this "
                   "machine only; use 0.0.0.0 to accept other machines and containers)")
    s.add_argument("--port", type=parse_port, default=None,
                   help=f"HTTP port (default: ATLAS_PORT, else {DEFAULT_PORT})")
    s.add_argument("--api-key", "--auth-token", action="append", default=None, metavar="KEY",
                   help="require this key (Bearer or x-api-key; repeatable; default: "
                   "ATLAS_API_KEY, else no key)")
    s.add_argument("--auth-tokens-file", default=None, metavar="PATH",
                   help="file of accepted keys, one per line (# comments allowed)")
    s.add_argument("--request-timeout", type=parse_seconds, default=0.0, metavar="SECONDS",
                   help="abort a generation after this long (default 0: no limit)")
    s.add_argument("--max-request-body", type=parse_size, default="32M", metavar="SIZE",
                   help="largest request body; bigger gets HTTP 413 (default 32M)")
    s.add_argument("--default-chat-template-kwargs", type=parse_json_object, default={},
                   metavar="JSON", help='chat-template variables for every request, e.g. '
                   '\'{"enable_thinking": true}\' (requests may override)')
    s.add_argument("--chat-template", default=None, metavar="PATH|TEMPLATE",
                   help="chat template to use instead of the model's (a .jinja file or the "
                   "template text)")
    s.add_argument("--strict-max-tokens", action="store_true",
                   help="answer max_tokens beyond the room left in the context with HTTP 400 "
                   "(default: lower it to that room; the output ends with finish reason length)")
    s.add_argument("--allowed-origin", "--allowed-origins", action="append", default=[],
                   metavar="ORIGIN", help="allow browser pages from this origin to call the API "
                   "(CORS; without --api-key other pages get 403; repeatable; `*` for any)")
    s.add_argument("--allowed-host", "--allowed-hosts", action="append", default=[],
                   metavar="NAME", help="also answer to this Host name without --api-key "
                   "(default: localhost names and the bind address; any when bound to 0.0.0.0; "
                   "repeatable; `*` for any)")
    s.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=True,
                   help="log one line per request on stderr (default on)")
    s.add_argument("--allowed-media-domains", "--allow-image-urls", nargs="+", action="extend",
                   default=[], metavar="DOMAIN", help="fetch http(s) image URLs from these "
                   "domains and their subdomains (`*` for any; default: none, images come "
                   "inline as data: URLs or base64)")
    s.add_argument("--max-images-per-request", type=int, default=8, metavar="N",
                   help="most images in one request (default 8)")
    add_agent_arguments(p)
    add_policy_arguments(p)
    add_speculative_arguments(p)
    add_parallel_arguments(p)
    return p


def add_kv_tier_arguments(p: argparse.ArgumentParser) -> None:
    """Host-memory and disk tiers of the prefix cache (see docs/serving.md, "KV tiers")."""
    t = p.add_argument_group("KV tiers")
    t.add_argument("--kv-host-gb", type=float, default=0.0, metavar="GIB",
                   help="host memory for prefix-cache blocks evicted from the GPU (default 0: "
                   "none)")
    t.add_argument("--kv-offload-dir", default=None, metavar="DIR",
                   help="keep evicted prefix-cache blocks in this directory (NVMe) too; they "
                   "survive restarts (default: no disk tier)")
    t.add_argument("--kv-offload-gb", type=float, default=64.0, metavar="GIB",
                   help="most GiB kept in --kv-offload-dir, least recently used out first "
                   "(default 64)")
    t.add_argument("--kv-storage", default="auto", metavar="NAME",
                   help="storage backend of the disk tier: io_uring, posix (default auto: "
                   "io_uring when atlas-iouring is installed and the kernel allows it)")
    t.add_argument("--kv-disk-restore", default="auto", choices=("auto", "always", "never"),
                   help="prompt blocks only the disk tier holds: read back (always), recompute "
                   "(never), or the faster by measured disk and prefill rates (default auto)")


def served_names(args) -> list[str]:
    if args.served_model_name:
        return args.served_model_name
    if args.model is None:
        return [DEMO_NAME]
    names = [args.model]
    base = Path(args.model.rstrip("/")).name
    if Path(args.model).exists() and base and base != args.model:
        names.append(base)
    return names


def engine_args(args):
    from atlas_core.cli import UserError
    from atlas_core.engine import EngineArgs
    try:
        eargs = EngineArgs(
            model=args.model, backend=args.backend, dtype=args.dtype, seed=args.seed,
            max_num_seqs=args.max_num_seqs, max_batch_size=args.max_batch_size,
            max_prefill_tokens=args.max_prefill_tokens, max_seq_len=args.max_seq_len,
            gpu_memory_utilization=args.gpu_memory_utilization, kv_cache_dtype=args.kv_cache_dtype,
            kv_high_precision_layers=args.kv_high_precision_layers,
            block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
            enable_prefix_caching=args.enable_prefix_caching, cache_dir=args.cache_dir,
            served_model_name=served_names(args)[0], max_waiting=args.max_waiting,
            revision=args.revision, async_scheduling=args.async_scheduling,
            kv_host_gb=args.kv_host_gb, kv_offload_dir=args.kv_offload_dir,
            kv_offload_gb=args.kv_offload_gb, kv_storage=args.kv_storage,
            kv_disk_restore=args.kv_disk_restore,
            dequantize_weights=args.dequantize_weights, batch_invariant=args.batch_invariant,
            load_format=args.load_format,
            speculative_config=speculative_config(args, args.model), **policy_kwargs(args),
            **parallel_kwargs(args))
        if eargs.kv_offload_dir:
            from atlas_core.engine.kv_tier_setup import check_offload_dir
            check_offload_dir(eargs.kv_offload_dir)
        return eargs
    except ValueError as exc:
        message = re.sub(r"^(\w+) must", lambda m: f"--{m.group(1).replace('_', '-')} must",
                         str(exc))
        raise UserError(message) from None


def check_model(args) -> None:
    """Fail before binding the port when MODEL clearly cannot load."""
    from atlas_core.cli import UserError
    from atlas_core.engine.loading import model_path_or_demo
    try:
        source = model_path_or_demo(args.model)
    except FileNotFoundError:
        raise UserError("no MODEL given and the built-in demo model is not installed; pass a "
                        "model directory or Hugging Face id, e.g. `atlas serve Qwen/Qwen3-0.6B`"
                        ) from None
    path = Path(source).expanduser()
    looks_local = path.exists() or source.startswith((".", "/", "~")) or source.count("/") > 1
    if path.suffix == ".gguf":
        raise UserError(f"{source} is a GGUF file (llama.cpp's format), which Atlas does not "
                        "load; pass the model's Hugging Face id or its safetensors directory")
    if args.load_format == "dummy":
        from atlas_core.model.dummy import dummy_model_dir
        try:
            dummy_model_dir(path)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    if looks_local and not (path / "config.json").is_file():
        raise UserError(f"{source} is not a model directory (no config.json there); pass a "
                        "directory holding config.json + *.safetensors, or a Hugging Face id")
    check_backend(args.backend)


def check_backend(name: str | None) -> None:
    """Fail before binding the port when ``--backend`` names no installed backend."""
    from atlas_core.cli import UserError
    from atlas_core.plugins import Registry
    names = Registry().names("gpu_backends")
    if name is not None and name not in names:
        raise UserError(f"--backend {name}: no such GPU backend; installed: {', '.join(names)} "
                        "(`atlas plugins` lists them; install the plugin that provides it)")


def server_config(args):
    from atlas_core.cli import UserError
    from atlas_core.server import ServerConfig
    from atlas_core.server.auth import read_tokens_file
    from atlas_core.server.guards import default_allowed_hosts
    keys = list(args.api_key) if args.api_key else env.api_keys()
    if args.auth_tokens_file:
        try:
            keys += read_tokens_file(args.auth_tokens_file)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    return ServerConfig(served_model_names=served_names(args), api_keys=keys,
                        max_request_body=args.max_request_body,
                        request_timeout=args.request_timeout,
                        default_chat_template_kwargs=args.default_chat_template_kwargs,
                        allowed_origins=args.allowed_origin,
                        allowed_hosts=default_allowed_hosts(listen_address(args)[0],
                                                            args.allowed_host),
                        access_log=args.access_log, **agent_kwargs(args),
                        strict_max_tokens=args.strict_max_tokens,
                        allowed_media_domains=args.allowed_media_domains,
                        max_images_per_request=args.max_images_per_request)


def listen_address(args) -> tuple[str, int]:
    """``(host, port)``: the flags, else ``ATLAS_HOST`` / ``ATLAS_PORT``, else the defaults."""
    from atlas_core.cli import UserError
    try:
        port = args.port if args.port is not None else env.port()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return (args.host or env.host() or DEFAULT_HOST, DEFAULT_PORT if port is None else port)


def chat_template_override(value: str | None) -> str | None:
    """The ``--chat-template`` text (read and compiled now, before the port is bound)."""
    from atlas_core.cli import UserError
    from atlas_core.tokenizer.chat_template import ChatTemplateError, load_chat_template
    if value is None:
        return None
    try:
        return load_chat_template(value)
    except ChatTemplateError as exc:
        raise UserError(f"--chat-template: {exc}") from None


def describe(engine, names: list[str]) -> str:
    """One line with the model, backend and the sizing the engine chose."""
    kv = engine.kv_config
    backend = getattr(engine.backend, "name", type(engine.backend).__name__)
    mib = kv.num_blocks * kv.bytes_per_block / 2 ** 20
    return (f"model ready: {names[0]} | backend {backend} | KV cache {kv.num_blocks} blocks x "
            f"{kv.block_size} tokens ({kv.num_blocks * kv.block_size} tokens, {mib:.1f} MiB, "
            f"{kv.dtype_summary}) | max seq len {kv.max_seq_len} | max num seqs "
            f"{engine.args.max_num_seqs}")


def close_tiers(engines: list) -> None:
    """Persist the KV tiers of the engines a server ran and print their final state."""
    from atlas_core.engine.kv_tiers import close_kv_tiers
    for engine in engines:
        if engine.kv_tiers is not None:
            close_kv_tiers(engine)
            print(engine.kv_tiers.describe(), flush=True)


def run(args) -> int:
    from atlas_core.cli import UserError, error_message
    from atlas_core.engine import AsyncLLMEngine, LLMEngine
    from atlas_core.server import create_app
    from atlas_core.server.access_log import log_to_stderr
    from atlas_core.server.launch import bind_socket, make_server

    check_model(args)
    eargs = engine_args(args)
    if is_worker_node(eargs):
        from atlas_core.parallel.launch import run_node_workers
        return run_node_workers(eargs)
    config = server_config(args)
    template = chat_template_override(args.chat_template)
    host, port = listen_address(args)
    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; "
                        "pick another --port or stop the program using it") from None
    failure: list[str] = []
    loaded: list = []
    server = None

    def load():
        try:
            engine = LLMEngine.from_args(eargs)
            if engine.tokenizer is None:
                raise ValueError("it has no tokenizer (tokenizer.json + tokenizer_config.json); "
                                 "copy them from the original model into its directory")
            if template is not None:
                engine.tokenizer.chat_templates = {"default": template}
        except Exception as exc:
            failure.append(f"cannot load {args.model or DEMO_NAME}: {error_message(exc)}")
            server.should_exit = True
            raise
        print(describe(engine, config.served_model_names), flush=True)
        if eargs.load_format == "dummy":
            from atlas_core.model.dummy import DUMMY_WARNING
            print(f"warning: {DUMMY_WARNING}", flush=True)
        if eargs.tensor_parallel_size == 1:
            from atlas_core.model.quantized_loading import weights_line
            print(weights_line(engine.model), flush=True)
        from atlas_core.bench.floor import floor_line
        print(floor_line(engine), flush=True)
        if engine.kv_tiers is not None:
            print(engine.kv_tiers.describe(), flush=True)
        loaded.append(engine)
        aengine = AsyncLLMEngine(engine)
        if hasattr(engine.runner, "set_failure_handler"):
            engine.runner.set_failure_handler(aengine.fail)
        return aengine

    app = create_app(None, config, loader=load)
    app.on_shutdown.append(lambda: close_tiers(loaded))
    app.on_shutdown.append(lambda: [e.runner.shutdown() for e in loaded
                                    if hasattr(e.runner, "set_failure_handler")])
    server = make_server(app, sock, log_level="warning")
    url = f"http://{host}:{sock.getsockname()[1]}"
    print(f"Atlas listening on {url}/v1 (OpenAI + Anthropic APIs); loading "
          f"{args.model or DEMO_NAME}, GET /health turns 200 when ready", flush=True)
    if host in LOOPBACK:
        print("  reachable from this machine only; pass --host 0.0.0.0 to accept other "
              "machines and containers", flush=True)
    elif not config.api_keys:
        print("  warning: listening beyond this machine without --api-key: anyone who can "
              "reach the port can use the server", flush=True)
    if config.access_log:
        log_to_stderr()
    server.run(sockets=[sock])
    reason = failure[0] if failure else app.state.atlas.exit_reason
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 1
    return 0
