"""Built-in storage backends: ``memory`` and ``posix`` (files in a directory)."""

from atlas_core.hookspecs import hookimpl


@hookimpl
def register_storage_backends(register):
    register("memory", "atlas_core.storage.memory:MemoryStorage")
    register("posix", "atlas_core.storage.posix:PosixStorage")
