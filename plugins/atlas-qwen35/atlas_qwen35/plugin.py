"""Registers this family's layer kinds, weight loaders and Gated DeltaNet ops (specs, numpy and
CUDA implementations, CUDA sources). Lazy strings: importing this is free; the CUDA part
(``atlas-qwen35[cuda]``) is imported only when the cuda backend builds its op table.

The ConditionalGeneration (vision-language) checkpoints load with their vision tower when
atlas-qwen3vl is installed (its loaders build this family's text stack around the tower), else
as their text model alone."""

from importlib.util import find_spec

from atlas_core.api import OpSpec, hookimpl, registers, registers_ops

LAYERS = {
    "gated_deltanet": "atlas_qwen35.gated_deltanet:GatedDeltaNet",
    "gated_attention": "atlas_qwen35.gated_attention:GatedAttention",
    "moe_shared_expert": "atlas_qwen35.moe:SharedExpertMoE",
}

LOADERS = {
    "Qwen3NextForCausalLM": "atlas_qwen35.loaders:Qwen3NextLoader",
    "Qwen3_5ForCausalLM": "atlas_qwen35.loaders:Qwen3_5Loader",
    "Qwen3_5MoeForCausalLM": "atlas_qwen35.loaders:Qwen3_5MoeLoader",
    "Qwen3_5ForConditionalGeneration": "atlas_qwen35.loaders:Qwen3_5VLLoader",
    "Qwen3_5MoeForConditionalGeneration": "atlas_qwen35.loaders:Qwen3_5MoeVLLoader",
}
if find_spec("atlas_qwen3vl") is not None:
    LOADERS.update({
        "Qwen3_5ForConditionalGeneration": "atlas_qwen3vl.qwen35:Qwen3_5VisionLoader",
        "Qwen3_5MoeForConditionalGeneration": "atlas_qwen3vl.qwen35:Qwen3_5MoeVisionLoader",
    })

register_layers = registers(LAYERS)
register_weight_loaders = registers(LOADERS)

_REF = "atlas_qwen35.gdn_reference"
_CASES = "atlas_qwen35.gdn_cases"

#: The Gated DeltaNet ops: ``(spec, numpy implementation)`` (None: the numpy backend runs the
#: unfused definition, else the reference). Every op's cuda implementation is the method of the
#: same name of :data:`CUDA_OPS` (``atlas-qwen35[cuda]``).
OPS = (
    (OpSpec("causal_conv1d", f"{_REF}:causal_conv1d", stateful=True,
            cases=f"{_CASES}:causal_conv1d_cases"), None),
    (OpSpec("causal_conv1d_update", f"{_REF}:causal_conv1d_update", stateful=True,
            cases=f"{_CASES}:causal_conv1d_update_cases"), None),
    (OpSpec("gated_delta_rule_chunked", f"{_REF}:gated_delta_rule_chunked", stateful=True,
            cases=f"{_CASES}:gated_delta_rule_chunked_cases"),
     "atlas_qwen35.gdn_numpy:gated_delta_rule_chunked"),
    (OpSpec("gated_delta_rule_recurrent", f"{_REF}:gated_delta_rule_recurrent", stateful=True,
            cases=f"{_CASES}:gated_delta_rule_recurrent_cases"),
     "atlas_qwen35.gdn_numpy:gated_delta_rule_recurrent"),
    (OpSpec("gated_delta_rule_decode", f"{_REF}:gated_delta_rule_decode", stateful=True,
            unfused=f"{_REF}:compose_gdn_decode",
            cases=f"{_CASES}:gated_delta_rule_decode_cases"), None),
    (OpSpec("gdn_gating", f"{_REF}:gdn_gating", cases=f"{_CASES}:gdn_gating_cases"), None),
    (OpSpec("rms_norm_gated", f"{_REF}:rms_norm_gated", cases=f"{_CASES}:rms_norm_gated_cases"),
     None),
)
CUDA_OPS = "atlas_qwen35.cuda.gdn_ops:GdnOps"

register_ops = registers_ops(OPS, columns=("numpy",), classes={"cuda": CUDA_OPS})


@hookimpl
def register_kernel_sources(register):
    register("qwen35", "atlas_qwen35.cuda:kernel_dir")
