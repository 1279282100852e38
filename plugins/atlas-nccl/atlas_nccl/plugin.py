"""Registers the ``nccl`` comm backend, the cuda implementations of the parallel ops and their
kernel sources. Lazy strings: importing this imports neither nccl4py nor CUDA."""

from atlas_core.api import hookimpl

#: The parallel ops (declared by atlas-core, :mod:`atlas_core.parallel.ops`) this plugin runs on
#: the cuda backend, each a method of the same name of :data:`CUDA_OPS`.
PARALLEL_OPS = ("moe_remap_ids", "embedding_shard", "gather_vocab_shards")
CUDA_OPS = "atlas_nccl.cuda_ops:ParallelOps"


@hookimpl
def register_comm_backends(register):
    register("nccl", "atlas_nccl.comm:NcclComm")


@hookimpl
def register_ops(register):
    for name in PARALLEL_OPS:
        register(name, f"{CUDA_OPS}.{name}", backend="cuda")


@hookimpl
def register_kernel_sources(register):
    register("nccl", "atlas_nccl.cuda_ops:kernel_dir")
