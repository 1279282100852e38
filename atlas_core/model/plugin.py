"""Built-in layer kinds shared by model families."""

from atlas_core.hookspecs import hookimpl


@hookimpl
def register_layers(register):
    register("attention", "atlas_core.model.layers.attention:Attention")
    register("mlp", "atlas_core.model.layers.mlp:GatedMLP")
    register("moe", "atlas_core.model.layers.moe:SparseMoE")
