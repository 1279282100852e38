"""Entry point of the plugin: registers lazily, so importing it imports nothing else."""

from atlas_core.hookspecs import hookimpl


@hookimpl
def register_weight_loaders(register):
    register("ToyForCausalLM", "atlas_toy.loader:ToyLoader")
