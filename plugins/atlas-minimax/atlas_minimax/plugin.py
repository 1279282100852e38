"""Registers this family's layer kinds, weight loader and routing op. Lazy strings: importing
this imports nothing heavy."""

from atlas_core.api import OpSpec, hookimpl

LAYERS = {
    "minimax_m2_attention": "atlas_minimax.attention:MiniMaxM2Attention",
    "minimax_m2_moe": "atlas_minimax.moe:MiniMaxM2SparseMoE",
}

LOADERS = {"MiniMaxM2ForCausalLM": "atlas_minimax.loader:MiniMaxM2Loader"}

#: Sigmoid routing with a selection-only bias. The numpy backend runs the reference; no other
#: backend implements it yet, so :class:`~atlas_minimax.moe.MiniMaxM2SparseMoE` refuses to load
#: there with an error naming the op.
MOE_ROUTE_BIASED = OpSpec("moe_route_biased", "atlas_minimax.routing:moe_route_biased",
                          cases="atlas_minimax.routing_cases:moe_route_biased_cases")


@hookimpl
def register_layers(register):
    for kind, factory in LAYERS.items():
        register(kind, factory)


@hookimpl
def register_weight_loaders(register):
    for architecture, factory in LOADERS.items():
        register(architecture, factory)


@hookimpl
def register_ops(register):
    register(MOE_ROUTE_BIASED.name, MOE_ROUTE_BIASED)
