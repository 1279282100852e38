"""Registers the ``io_uring`` storage backend. A lazy string: importing this imports nothing."""

from atlas_core.api import hookimpl


@hookimpl
def register_storage_backends(register):
    register("io_uring", "atlas_iouring.storage:create_storage")
