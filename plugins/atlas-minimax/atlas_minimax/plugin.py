"""Registers this family's layer kinds, weight loader, routing op (spec and CUDA implementation)
and CUDA sources. Lazy strings: importing this imports nothing heavy; the CUDA part
(``atlas-minimax[cuda]``) is imported only when the cuda backend builds its op table."""

from atlas_core.api import OpSpec, hookimpl, registers, registers_ops

LAYERS = {
    "minimax_m2_attention": "atlas_minimax.attention:MiniMaxM2Attention",
    "minimax_m2_moe": "atlas_minimax.moe:MiniMaxM2SparseMoE",
}

LOADERS = {"MiniMaxM2ForCausalLM": "atlas_minimax.loader:MiniMaxM2Loader"}

#: Sigmoid routing with a selection-only bias: the numpy backend runs the reference, the cuda
#: backend ``moe_route_biased.cu`` (``atlas-minimax[cuda]``); on a backend with neither,
#: :class:`~atlas_minimax.moe.MiniMaxM2SparseMoE` refuses to load with an error naming the op.
MOE_ROUTE_BIASED = OpSpec("moe_route_biased", "atlas_minimax.routing:moe_route_biased",
                          cases="atlas_minimax.routing_cases:moe_route_biased_cases")
CUDA_OPS = "atlas_minimax.cuda.routing_ops:MiniMaxCudaOps"


register_layers = registers(LAYERS)
register_weight_loaders = registers(LOADERS)
register_ops = registers_ops((MOE_ROUTE_BIASED,), classes={"cuda": CUDA_OPS})


@hookimpl
def register_kernel_sources(register):
    register("minimax", "atlas_minimax.cuda:kernel_dir")
