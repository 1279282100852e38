"""Registers this family's layer kinds, weight loader and ops (specs, numpy and CUDA
implementations, CUDA sources). Lazy strings: importing this is free; the CUDA part
(``atlas-nemotron-h[cuda]``) is imported only when the cuda backend builds its op table."""

from atlas_core.api import OpSpec, hookimpl, registers, registers_ops

LAYERS = {
    "mamba2": "atlas_nemotron_h.mamba2:Mamba2Mixer",
    "nemotron_h_attention": "atlas_nemotron_h.attention:NoPEAttention",
    "relu2_mlp": "atlas_nemotron_h.ffn:ReLU2MLP",
    "nemotron_h_moe": "atlas_nemotron_h.ffn:NemotronHMoE",
}

LOADERS = {"NemotronHForCausalLM": "atlas_nemotron_h.loader:NemotronHLoader"}

_MAMBA = "atlas_nemotron_h.mamba2_reference"
_FFN = "atlas_nemotron_h.ffn_reference"
_CASES = "atlas_nemotron_h.op_cases"
_NUMPY = "atlas_nemotron_h.mamba2_numpy"
_CUDA = "atlas_nemotron_h.cuda.mamba2_ops:Mamba2CudaOps"
_CUDA_MOE = "atlas_nemotron_h.cuda.moe_ops:NemotronMoeCudaOps"


def _spec(name: str, module: str, **flags) -> OpSpec:
    return OpSpec(name, f"{module}:{name}", cases=f"{_CASES}:{name}_cases", **flags)


#: ``(spec, numpy implementation, cuda implementation)``; None: the backend runs the unfused
#: definition, else (numpy) the reference.
OPS = (
    (_spec("mamba2_conv1d", _MAMBA, stateful=True), None, f"{_CUDA}.mamba2_conv1d"),
    (_spec("mamba2_conv1d_update", _MAMBA, stateful=True), None,
     f"{_CUDA}.mamba2_conv1d_update"),
    (_spec("mamba2_ssd_chunked", _MAMBA, stateful=True), f"{_NUMPY}:mamba2_ssd_chunked",
     f"{_CUDA}.mamba2_ssd_chunked"),
    (_spec("mamba2_ssd_recurrent", _MAMBA, stateful=True), f"{_NUMPY}:mamba2_ssd_recurrent",
     f"{_CUDA}.mamba2_ssd_recurrent"),
    (_spec("mamba2_gated_norm", _MAMBA), None, f"{_CUDA}.mamba2_gated_norm"),
    (_spec("mamba2_decode", _MAMBA, stateful=True, unfused=f"{_MAMBA}:compose_mamba2_decode"),
     None, f"{_CUDA}.mamba2_decode"),
    (_spec("relu2", _FFN), None, f"{_CUDA}.relu2"),
    (_spec("nemotron_h_moe_route", _FFN), None, f"{_CUDA_MOE}.nemotron_h_moe_route"),
    (_spec("nemotron_h_moe_experts", _FFN), None, f"{_CUDA_MOE}.nemotron_h_moe_experts"),
)


register_layers = registers(LAYERS)
register_weight_loaders = registers(LOADERS)
register_ops = registers_ops(OPS, columns=("numpy", "cuda"))


@hookimpl
def register_kernel_sources(register):
    register("nemotron_h", "atlas_nemotron_h.cuda:kernel_dir")
