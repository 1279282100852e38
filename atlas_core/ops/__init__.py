"""The op contract.

Each op has one name across the CUDA source, the backend method (``backend.ops.<name>``), the
NumPy reference in :mod:`atlas_core.ops.reference` (whose docstring states shapes, dtypes and the
formula), the contract test in :mod:`atlas_core.testing.contracts` and a micro-benchmark.

Ops return new arrays (taken from the backend's step workspace) except the in-place ops listed
in :data:`INPLACE_OPS`.
"""

from atlas_core.ops import reference

#: Every op a GpuBackend must provide on ``backend.ops``.
OP_NAMES = (
    "embedding",
    "rms_norm",
    "rms_norm_linear",
    "linear",
    "add",
    "silu_and_mul",
    "gelu_tanh_and_mul",
    "linear_act_and_mul",
    "rotary_embedding",
    "reshape_and_cache",
    "prefill_attention",
    "paged_attention",
    "qk_norm_rope_and_cache",
    "rope_cache_attention",
    "moe_route",
    "moe_experts",
    "moe_block",
    "rms_norm_moe_block",
    "argmax",
    "log_softmax",
    "topk",
    "apply_penalties",
    "sample",
    "causal_conv1d",
    "causal_conv1d_update",
    "gated_delta_rule_chunked",
    "gated_delta_rule_recurrent",
    "gated_delta_rule_decode",
    "gdn_gating",
    "rms_norm_gated",
    "sigmoid_mul",
    "apply_token_bitmask",
)

#: Ops that write into arrays they are given (the KV cache) rather than returning new ones.
INPLACE_OPS = ("reshape_and_cache", "qk_norm_rope_and_cache", "rope_cache_attention")

#: Ops that also update state pools in place while returning a new array (recurrent layers).
STATEFUL_OPS = ("causal_conv1d", "causal_conv1d_update", "gated_delta_rule_chunked",
                "gated_delta_rule_recurrent", "gated_delta_rule_decode")

__all__ = ["INPLACE_OPS", "OP_NAMES", "STATEFUL_OPS", "reference"]
