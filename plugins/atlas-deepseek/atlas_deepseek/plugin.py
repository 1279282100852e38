"""Registers the MLA layer kind, the DeepSeek MoE kind, the ``DeepseekV3ForCausalLM`` loader,
the MLA and grouped-routing ops (specs, CUDA implementations) and the CUDA sources. Lazy strings:
importing this imports nothing heavy; the CUDA part (``atlas-deepseek[cuda]``) is imported only
when the cuda backend builds its op table. atlas-mistral builds its layers from these kinds."""

from atlas_core.api import OpSpec, hookimpl, registers, registers_ops

LAYERS = {
    "mla_attention": "atlas_deepseek.mla:MLAttention",
    "deepseek_moe": "atlas_deepseek.moe:DeepseekMoE",
}

LOADERS = {"DeepseekV3ForCausalLM": "atlas_deepseek.loader:DeepseekV3Loader"}

_REF = "atlas_deepseek.mla_reference"
_CASES = "atlas_deepseek.mla_cases"

#: ``(spec, has a cuda implementation)``. The cuda implementations are the methods of the same
#: name of :data:`CUDA_OPS` (a backend without the expanded prefill ops runs MLA absorbed).
OPS = (
    (OpSpec("mla_latent_cache", f"{_REF}:mla_latent_cache", inplace=True,
            cases=f"{_CASES}:mla_latent_cache_cases"), True),
    (OpSpec("mla_rope_query", f"{_REF}:mla_rope_query",
            cases=f"{_CASES}:mla_rope_query_cases"), True),
    (OpSpec("mla_absorb_query", f"{_REF}:mla_absorb_query",
            cases=f"{_CASES}:mla_absorb_query_cases"), True),
    (OpSpec("mla_absorbed_attention", f"{_REF}:mla_absorbed_attention",
            cases=f"{_CASES}:mla_absorbed_attention_cases"), True),
    (OpSpec("mla_absorb_output", f"{_REF}:mla_absorb_output",
            cases=f"{_CASES}:mla_absorb_output_cases"), True),
    (OpSpec("mla_gather_latent", f"{_REF}:mla_gather_latent",
            cases=f"{_CASES}:mla_gather_latent_cases"), True),
    (OpSpec("mla_expanded_attention", f"{_REF}:mla_expanded_attention",
            cases=f"{_CASES}:mla_expanded_attention_cases"), True),
    (OpSpec("moe_route_grouped", "atlas_deepseek.routing:moe_route_grouped",
            cases="atlas_deepseek.routing_cases:moe_route_grouped_cases"), True),
)
CUDA_OPS = "atlas_deepseek.cuda.mla_ops:MlaCudaOps"


register_layers = registers(LAYERS)
register_weight_loaders = registers(LOADERS)
register_ops = registers_ops(OPS, columns=("cuda",), classes={"cuda": CUDA_OPS})


@hookimpl
def register_kernel_sources(register):
    register("deepseek", "atlas_deepseek.cuda:kernel_dir")
