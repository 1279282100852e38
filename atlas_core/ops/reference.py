"""The NumPy references of the core ops in one namespace: the semantics all backends are tested
against. Plugins' ops have their references in the plugin (``OpRegistry.reference(name)``).

It also holds the reference helpers that several model families share and that are not core
ops themselves (:func:`gather_kv`, :func:`causal_softmax`, :func:`select_grouped_topk`, and
the recurrent-state helpers of :mod:`atlas_core.ops.recurrent`): a family's op spec may name
one of them as its reference through a module-level alias.
"""

from atlas_core.ops.attention import (causal_softmax, gather_kv, paged_attention,
                                      prefill_attention, qk_norm_rope_and_cache,
                                      reshape_and_cache, rope_cache_attention)
from atlas_core.ops.block_copy import gather_blocks, scatter_blocks
from atlas_core.ops.guided import apply_token_bitmask
from atlas_core.ops.logits_filters import apply_dry, apply_top_n_sigma, apply_xtc
from atlas_core.ops.moe import (moe_block, moe_experts, moe_route, rms_norm_moe_block,
                                select_grouped_topk)
from atlas_core.ops.norm import (act_and_mul, add, embedding, gelu_tanh_and_mul, linear,
                                 linear_act_and_mul, rms_norm, rms_norm_linear, sigmoid_mul,
                                 silu_and_mul)
from atlas_core.ops.recurrent import causal_conv1d, causal_conv1d_update, softplus, state_runs
from atlas_core.ops.rotary import rope_cos_sin_cache, rotary_embedding
from atlas_core.ops.sampling import apply_penalties, argmax, log_softmax, sample, topk

__all__ = [
    "act_and_mul", "add", "apply_penalties", "argmax", "embedding", "gather_kv",
    "gelu_tanh_and_mul", "linear", "linear_act_and_mul", "log_softmax", "moe_block", "moe_experts",
    "moe_route", "paged_attention",
    "prefill_attention", "qk_norm_rope_and_cache", "reshape_and_cache", "rms_norm",
    "rms_norm_linear", "rms_norm_moe_block", "rope_cache_attention",
    "rope_cos_sin_cache", "rotary_embedding", "sample", "sigmoid_mul", "silu_and_mul", "topk",
    "apply_token_bitmask", "apply_dry", "apply_xtc", "apply_top_n_sigma", "gather_blocks",
    "scatter_blocks",
    # shared by model families' references, not core ops
    "causal_conv1d", "causal_conv1d_update", "causal_softmax", "select_grouped_topk", "softplus",
    "state_runs",
]
