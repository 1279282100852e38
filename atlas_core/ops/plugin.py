"""Registers the core (dense-transformer) op specs. Lazy strings: importing this is free.

Contract cases live in :mod:`atlas_core.testing.contracts_core_cases` (``<op>_cases``), those
of the weight-taking ops in :mod:`atlas_core.testing.quant_cases` (the core cases plus every
quantized weight format, ``cases="quant"``); ops
declared with ``cases=None`` keep hand-written contract tests (KV cache and attention, sampling,
guided decoding, ``linear``'s weight-cache check). Model families register their own ops the
same way (atlas-qwen35: Gated DeltaNet).
"""

from atlas_core.hookspecs import hookimpl
from atlas_core.ops.spec import OpSpec

_M = "atlas_core.ops."


def _spec(name: str, module: str, cases: str | None = "core", **flags) -> OpSpec:
    if cases == "core":
        cases = f"atlas_core.testing.contracts_core_cases:{name}_cases"
    elif cases == "quant":
        cases = f"atlas_core.testing.quant_cases:{name}_cases"
    return OpSpec(name, f"{_M}{module}:{name}", cases=cases, **flags)


#: Every op core declares, with its reference module and flags.
CORE_OPS = (
    _spec("embedding", "norm"),
    _spec("rms_norm", "norm"),
    _spec("rms_norm_linear", "norm", unfused=f"{_M}norm:compose_rms_norm_linear", cases="quant"),
    _spec("linear", "norm", cases="quant"),
    _spec("add", "norm"),
    _spec("silu_and_mul", "norm"),
    _spec("gelu_tanh_and_mul", "norm"),
    _spec("linear_act_and_mul", "norm", cases="quant"),
    _spec("sigmoid_mul", "norm"),
    _spec("rotary_embedding", "rotary"),
    _spec("reshape_and_cache", "attention", inplace=True, cases=None),
    _spec("prefill_attention", "attention", cases=None),
    _spec("paged_attention", "attention", cases=None),
    _spec("qk_norm_rope_and_cache", "attention", inplace=True,
          unfused=f"{_M}attention:compose_qk_norm_rope_and_cache", cases=None),
    _spec("rope_cache_attention", "attention", inplace=True,
          unfused=f"{_M}attention:compose_rope_cache_attention", cases=None),
    _spec("moe_route", "moe"),
    _spec("moe_experts", "moe", cases="quant"),
    _spec("moe_block", "moe", unfused=f"{_M}moe:unfused_moe_block", cases="quant"),
    _spec("rms_norm_moe_block", "moe", unfused=f"{_M}moe:unfused_rms_norm_moe_block",
          cases="quant"),
    _spec("argmax", "sampling", cases=None),
    _spec("log_softmax", "sampling", cases=None),
    _spec("topk", "sampling", cases=None),
    _spec("apply_penalties", "sampling", cases=None),
    _spec("sample", "sampling", cases=None),
    _spec("apply_dry", "logits_filters",
          cases="atlas_core.testing.logits_filter_cases:apply_dry_cases"),
    _spec("apply_xtc", "logits_filters",
          cases="atlas_core.testing.logits_filter_cases:apply_xtc_cases"),
    _spec("apply_top_n_sigma", "logits_filters",
          cases="atlas_core.testing.logits_filter_cases:apply_top_n_sigma_cases"),
    _spec("apply_token_bitmask", "guided", cases=None),
    _spec("gather_blocks", "block_copy", inplace=True,
          cases="atlas_core.testing.block_copy_cases:gather_blocks_cases"),
    _spec("scatter_blocks", "block_copy", inplace=True,
          cases="atlas_core.testing.block_copy_cases:scatter_blocks_cases"),
)


@hookimpl
def register_ops(register):
    for spec in CORE_OPS:
        register(spec.name, spec)
