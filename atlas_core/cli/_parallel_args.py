"""``atlas serve`` flags of multi-GPU and multi-node runs (vLLM's names; docs/multi-gpu.md)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from atlas_core.cli._arg_types import parse_port

#: EngineArgs fields these flags set (argparse dest == field name).
PARALLEL_FIELDS = ("tensor_parallel_size", "enable_expert_parallel", "nnodes", "node_rank",
                   "master_addr", "master_port", "distributed_executor_backend",
                   "distributed_timeout")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_parallel_arguments(p: argparse.ArgumentParser) -> None:
    """Add the parallelism flags to ``p``."""
    g = p.add_argument_group("multi-GPU (docs/multi-gpu.md)")
    g.add_argument("--tensor-parallel-size", "-tp", type=_positive_int, default=1, metavar="N",
                   help="split the model over N GPUs, one worker process each (default 1)")
    g.add_argument("--enable-expert-parallel", action="store_true",
                   help="MoE models: each GPU holds num_experts / N whole experts instead of a "
                   "slice of every expert")
    g.add_argument("--nnodes", type=_positive_int, default=1, metavar="K",
                   help="machines of the run (default 1); start `atlas serve` with the same "
                   "flags on each, --node-rank 0 serves HTTP")
    g.add_argument("--node-rank", type=int, default=0, metavar="R",
                   help="this machine's index in 0..K-1 (default 0)")
    g.add_argument("--master-addr", default=None, metavar="HOST",
                   help="address of node 0, where ranks meet (default: MASTER_ADDR, else "
                   "127.0.0.1)")
    g.add_argument("--master-port", type=parse_port, default=None, metavar="PORT",
                   help="rendezvous port on node 0 (default: MASTER_PORT, else a free port on "
                   "one node)")
    g.add_argument("--distributed-executor-backend", choices=["mp", "ray"], default="mp",
                   help="mp: worker processes spawned by atlas (default); ray: Ray tasks")
    g.add_argument("--distributed-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="a rank waiting longer than this for its peers fails the run "
                   "(default 300)")


def parallel_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """EngineArgs keyword arguments from the parsed flags (``WORLD_SIZE`` of a launcher's rank
    environment when ``-tp`` is not given)."""
    kwargs = {name: getattr(args, name) for name in PARALLEL_FIELDS}
    world = os.environ.get("WORLD_SIZE", "")
    if kwargs["tensor_parallel_size"] == 1 and "RANK" in os.environ and world.isdigit():
        kwargs["tensor_parallel_size"] = int(world)
    return kwargs


def is_worker_node(eargs: Any) -> bool:
    """Whether this process only hosts workers (``--node-rank`` > 0, or a launcher's rank > 0)."""
    if eargs.tensor_parallel_size <= 1 and eargs.nnodes <= 1:
        return False
    from atlas_core.parallel.launch import parallel_config
    return not parallel_config(eargs).is_front
