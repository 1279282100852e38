"""Registers the ``gb10`` kernel target of the cuda backend (lazily: nothing here imports
atlas-cuda or reads a file)."""

from atlas_core.api import hookimpl


@hookimpl
def register_kernel_targets(register):
    register("gb10", "atlas_gb10:target")
