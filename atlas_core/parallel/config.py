"""ParallelConfig: how many ranks, which of them run here, and where they meet.

Two ways to start a multi-process run, both without a cluster manager of our own:

* ``atlas serve MODEL -tp N [--nnodes K --node-rank R --master-addr HOST]``: node 0 runs the
  engine and spawns its share of the workers; every other node spawns its own share.
* a launcher that sets the standard rank environment (torchrun, Slurm, mpirun, Kubernetes
  LeaderWorkerSet): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``.
  The process of ``RANK`` 0 runs the engine and spawns worker 0; every other process is the
  worker of its rank. They meet at ``MASTER_PORT + 1`` (torchrun's agent holds MASTER_PORT).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Mapping

#: Port of the rendezvous store when nothing names one (single node: any free port).
DEFAULT_MASTER_PORT = 29533
#: Seconds a rank waits for its peers (rendezvous, a collective, a step) before failing.
DEFAULT_TIMEOUT_S = 300.0

#: Under a launcher, Atlas meets at ``MASTER_PORT + 1``: torchrun's agent holds MASTER_PORT.
RENDEZVOUS_PORT_OFFSET = 1

RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class ParallelConfig:
    """Sizes and placement of a parallel run.

    Attributes:
        tensor_parallel_size: ranks (one GPU each) the model is split over.
        enable_expert_parallel: MoE layers hold whole experts per rank (``num_experts / N``)
            instead of a slice of every expert.
        nnodes, node_rank: machines of the run and this one's index.
        master_addr, master_port: the rendezvous (the TCP store on node 0); port 0 picks a free
            one (single node only).
        comm_backend: registered CommBackend name (default: ``nccl`` on the cuda backend, else
            ``cpu``).
        executor: ``mp`` (processes spawned here) or ``ray``.
        timeout_s: how long a rank waits for its peers before it fails.
        launched_rank: set when a launcher started this process as one rank (rank env).
        local_rank: the GPU index of ``launched_rank`` on its machine.
    """

    tensor_parallel_size: int = 1
    enable_expert_parallel: bool = False
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    comm_backend: str | None = None
    executor: str = "mp"
    timeout_s: float = DEFAULT_TIMEOUT_S
    launched_rank: int | None = None
    local_rank: int | None = None

    def __post_init__(self) -> None:
        n = self.tensor_parallel_size
        if int(n) < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {n!r}")
        if int(self.nnodes) < 1 or not 0 <= int(self.node_rank) < int(self.nnodes):
            raise ValueError(f"node_rank must be in 0..nnodes-1 (nnodes={self.nnodes}), got "
                             f"{self.node_rank!r}")
        if n % self.nnodes:
            raise ValueError(f"tensor_parallel_size ({n}) must be a multiple of nnodes "
                             f"({self.nnodes}): every node runs the same number of GPUs")
        if self.executor not in ("mp", "ray"):
            raise ValueError(f"distributed executor must be mp or ray, got {self.executor!r}")
        if self.nnodes > 1 and not self.master_port:
            raise ValueError("a run over several nodes needs --master-port (every node must "
                             "name the same rendezvous port)")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout_s!r}")

    @property
    def world_size(self) -> int:
        """Ranks in all."""
        return self.tensor_parallel_size

    @property
    def ranks_per_node(self) -> int:
        return self.tensor_parallel_size // self.nnodes

    @property
    def is_front(self) -> bool:
        """This process runs the engine (node 0, or the launcher's rank 0)."""
        if self.launched_rank is not None:
            return self.launched_rank == 0
        return self.node_rank == 0

    def local_ranks(self) -> list[tuple[int, int]]:
        """``(rank, device index)`` of every worker this process starts or is."""
        if self.launched_rank is not None:
            return [(self.launched_rank, self.local_rank or 0)]
        per = self.ranks_per_node
        return [(self.node_rank * per + i, i) for i in range(per)]


def from_rank_env(base: ParallelConfig, environ: Mapping[str, str] | None = None) -> ParallelConfig:
    """``base`` placed by a launcher's rank environment, when one is set (else ``base``).

    Raises:
        ValueError: the environment is incomplete or disagrees with ``base``'s size.
    """
    environ = os.environ if environ is None else environ
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return base
    missing = [k for k in RANK_ENV if k not in environ and k != "LOCAL_RANK"]
    if missing:
        raise ValueError(f"the rank environment is incomplete: {', '.join(missing)} not set "
                         "(a launcher such as torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, "
                         "MASTER_ADDR and MASTER_PORT)")
    try:
        rank, world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        local = int(environ.get("LOCAL_RANK", rank))
        port = int(environ["MASTER_PORT"])
    except ValueError as exc:
        raise ValueError(f"the rank environment holds a non-integer: {exc}") from None
    if base.tensor_parallel_size not in (1, world):
        raise ValueError(f"--tensor-parallel-size {base.tensor_parallel_size} disagrees with "
                         f"WORLD_SIZE={world}: start one process per GPU and set both alike")
    if not 0 <= rank < world:
        raise ValueError(f"RANK={rank} is outside 0..WORLD_SIZE-1 ({world - 1})")
    return replace(base, tensor_parallel_size=world, launched_rank=rank, local_rank=local,
                   master_addr=environ["MASTER_ADDR"], master_port=port + RENDEZVOUS_PORT_OFFSET,
                   nnodes=1, node_rank=0)
