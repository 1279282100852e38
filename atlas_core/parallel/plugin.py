"""Built-in plugin of the parallel package: the ``cpu`` comm backend and the ops tensor and
expert parallelism add (specs; the numpy backend runs the references)."""

from atlas_core.hookspecs import hookimpl
from atlas_core.ops.spec import OpSpec

_OPS = "atlas_core.parallel.ops"


@hookimpl
def register_comm_backends(register):
    register("cpu", "atlas_core.parallel.cpu_comm:CpuComm")


@hookimpl
def register_ops(register):
    for name in ("moe_remap_ids", "embedding_shard", "gather_vocab_shards"):
        register(name, OpSpec(name, f"{_OPS}:{name}",
                                    cases=f"atlas_core.parallel.op_cases:{name}_cases"))
