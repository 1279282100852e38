"""Registers the Qwen3-VL weight loaders and the vision-tower ops: specs with NumPy references
(the numpy backend runs the references), CUDA implementations and their ``.cu`` source
(``atlas-qwen3vl[cuda]``, imported only when the cuda backend builds its op table). Lazy
strings: importing this is free."""

from atlas_core.api import OpSpec, hookimpl, registers, registers_ops

LOADERS = {
    "Qwen3VLForConditionalGeneration": "atlas_qwen3vl.loaders:Qwen3VLLoader",
    "Qwen3VLMoeForConditionalGeneration": "atlas_qwen3vl.loaders:Qwen3VLMoeLoader",
}

_REF = "atlas_qwen3vl.vision_reference"
_CASES = "atlas_qwen3vl.vision_cases"

#: The vision-tower ops, each with its contract cases; each op's cuda implementation is the
#: method of the same name of :data:`CUDA_OPS`.
OPS = tuple(OpSpec(name, f"{_REF}:{name}", cases=f"{_CASES}:{name}_cases")
            for name in ("layer_norm", "gelu", "vision_attention", "interpolate_pos_embed"))


CUDA_OPS = "atlas_qwen3vl.cuda.vision_ops:VisionCudaOps"

register_weight_loaders = registers(LOADERS)
register_ops = registers_ops(OPS, classes={"cuda": CUDA_OPS})


@hookimpl
def register_kernel_sources(register):
    register("qwen3vl", "atlas_qwen3vl.cuda:kernel_dir")
