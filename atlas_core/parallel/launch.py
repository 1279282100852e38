"""Starting a parallel run: the engine on the front process, workers everywhere else.

:func:`create_parallel_engine` is what ``LLMEngine.from_args`` calls for
``tensor_parallel_size > 1``; :func:`run_node_workers` is what ``atlas serve`` runs on a
machine that only hosts workers (``--node-rank`` > 0, or a launcher's rank > 0).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from atlas_core.parallel.config import ParallelConfig, from_rank_env

log = logging.getLogger(__name__)


def parallel_config(args: Any) -> ParallelConfig:
    """The :class:`ParallelConfig` of engine args, placed by the launcher's rank environment
    when one is set."""
    base = ParallelConfig(
        tensor_parallel_size=args.tensor_parallel_size,
        enable_expert_parallel=args.enable_expert_parallel, nnodes=args.nnodes,
        node_rank=args.node_rank, master_addr=args.master_addr or "127.0.0.1",
        master_port=args.master_port or 0, executor=args.distributed_executor_backend,
        timeout_s=args.distributed_timeout)
    return from_rank_env(base)


def check_parallel_args(args: Any) -> None:
    """Refuse settings the parallel engine does not run yet (before anything starts)."""
    if args.kv_host_gb or args.kv_offload_dir:
        raise ValueError("--kv-host-gb / --kv-offload-dir are not supported with "
                         "--tensor-parallel-size > 1 yet; drop them or serve on one GPU")
    if args.distributed_executor_backend == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ValueError("--distributed-executor-backend ray needs Ray: pip install ray "
                             "(or use the default, mp)") from None


def resolve_and_check(args: Any, parallel: ParallelConfig) -> Any:
    """``args`` naming the model's local directory (downloaded once, here, not by every
    worker), after checking that its config splits over ``parallel`` and that it has the MTP
    head ``mtp`` speculation drafts with (fails before any worker starts, naming the field
    that does not divide or the missing head)."""
    from atlas_core.engine.loading import model_path_or_demo
    from atlas_core.model.loader import architecture, create_loader, read_config
    from atlas_core.parallel.sharding import ShardPlan
    from atlas_core.plugins import Registry
    from atlas_core.weights.resolve import resolve_model
    if args.load_format == "dummy":
        from atlas_core.model.dummy import dummy_model_dir
        path = dummy_model_dir(model_path_or_demo(args.model))
    else:
        path = resolve_model(model_path_or_demo(args.model), cache_dir=args.cache_dir,
                             revision=args.revision)
    config = read_config(path)
    loader = create_loader(Registry(), architecture(config))
    loader.validate_config(config)
    resolved = loader.resolve_config(config) if hasattr(loader, "resolve_config") else config
    ShardPlan.from_config(resolved, 0, parallel.world_size, parallel.enable_expert_parallel)
    spec = args.speculative_config
    if spec is not None and spec.method == "mtp":
        from atlas_core.engine.spec.setup import no_mtp_head
        from atlas_core.weights.checkpoint import Checkpoint
        has_head = getattr(loader, "has_mtp_head", None)
        if has_head is None or not has_head(config, Checkpoint.open(path)):
            raise no_mtp_head(config)
    return replace(args, model=str(path))


def create_parallel_engine(engine_cls: Any, args: Any) -> Any:
    """An engine of class ``engine_cls`` whose steps run on ``args.tensor_parallel_size``
    workers (this process must be the front: node 0 or the launcher's rank 0)."""
    from atlas_core.engine.loading import generation_defaults
    from atlas_core.parallel.executor import ParallelExecutor
    parallel = parallel_config(args)
    if not parallel.is_front:
        raise ValueError("this process is a worker node (--node-rank / RANK > 0); start it "
                         "with `atlas serve` and it runs its workers only")
    check_parallel_args(args)
    args = resolve_and_check(args, parallel)
    if args.load_format == "dummy":
        from atlas_core.model.dummy import DUMMY_WARNING
        log.warning("%s (every rank fills its own shard on its device)", DUMMY_WARNING)
    executor = ParallelExecutor(args, parallel)
    path = executor.model.path
    tokenizer = None
    if any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        from atlas_core.tokenizer import Tokenizer
        tokenizer = Tokenizer.from_dir(path)
    try:
        engine = engine_cls(executor.model, executor.backend, args, tokenizer=tokenizer,
                            generation_defaults=generation_defaults(path), executor=executor)
    except BaseException:
        executor.shutdown()
        raise
    # the front holds no weights: the floor counts what the busiest worker reads
    engine.decode_timer.step_bytes = executor.step_bytes
    return engine


def run_node_workers(args: Any) -> int:
    """Run this machine's workers until they end; their worst exit status."""
    from atlas_core.parallel.executor import spawn_workers, stop_processes
    from atlas_core.parallel.worker import WorkerSpec, run_worker
    parallel = parallel_config(args)
    addr = (parallel.master_addr, parallel.master_port)
    if parallel.launched_rank is not None:
        rank, device = parallel.local_ranks()[0]
        from atlas_core.parallel.worker import select_device
        if args.backend in (None, "cuda"):
            select_device(device)
        return run_worker(WorkerSpec(rank, device, args, parallel, addr))
    procs = spawn_workers(parallel, args, addr)
    try:
        for proc in procs:
            proc.join()
    except KeyboardInterrupt:
        pass
    finally:
        stop_processes(procs, grace=0.0)
    return max((abs(p.exitcode or 0) for p in procs), default=0)
