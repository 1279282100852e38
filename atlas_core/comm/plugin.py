"""Built-in comm backend: ``loopback`` (a single rank)."""

from atlas_core.hookspecs import hookimpl


@hookimpl
def register_comm_backends(register):
    register("loopback", "atlas_core.comm.loopback:LoopbackComm")
