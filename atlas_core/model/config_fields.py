"""config.json fields under every name transformers saves them, and HF's defaults for absent ones.

transformers renames fields between releases: 5.x saves a ``qwen3_moe`` expert count as
``num_local_experts`` where 4.x wrote ``num_experts``, and the dtype as ``dtype`` instead of
``torch_dtype``. Loaders read one name per field (the left column of :data:`FIELD_ALIASES`);
:func:`canonical_config` fills it from whichever name the file used. Rope settings change shape
as well as name (``rope_theta`` + ``rope_scaling`` -> ``rope_parameters``); they are merged by
:func:`atlas_core.ops.rotary.rope_parameters`.

A field left out of config.json means the default of the architecture's HF config class, and
those differ between classes (``norm_topk_prob`` is False for ``Qwen3MoeConfig``, True for
``Qwen3NextConfig``): each loader declares its class's defaults as ``config_defaults``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

#: The name loaders read -> the other names current and previous transformers save it under.
FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "num_experts": ("num_local_experts", "n_routed_experts"),
    "torch_dtype": ("dtype",),
    "layer_types": ("layers_block_type",),
    "sliding_window": ("sliding_window_size",),
}

Default = Any | Callable[[dict[str, Any]], Any]


def _positive(config: dict[str, Any], name: str) -> int | None:
    value = config.get(name)
    return value if isinstance(value, int) and value > 0 else None


def head_dim_from_heads(config: dict[str, Any]) -> int | None:
    """``hidden_size // num_attention_heads``: the head size of classes without a fixed default
    (``None`` while either is missing: validation reports that field)."""
    hidden, heads = _positive(config, "hidden_size"), _positive(config, "num_attention_heads")
    return hidden // heads if hidden and heads else None


def kv_heads_from_heads(config: dict[str, Any]) -> int | None:
    """``num_attention_heads``: multi-head attention when the KV head count is left out."""
    return _positive(config, "num_attention_heads")


def canonical_config(config: Mapping[str, Any],
                     defaults: Mapping[str, Default] | None = None) -> dict[str, Any]:
    """A copy of ``config`` with every field under the name loaders read, defaults filled in.

    Args:
        config: a config.json dict as saved by any transformers release.
        defaults: field -> value used when the field is absent under every name (a callable
            receives the config and returns the value, e.g. :func:`head_dim_from_heads`). A
            field present with ``null`` keeps its ``None``, as in HF.

    Returns:
        A new dict; the names the file used are kept next to the canonical ones.
    """
    out = dict(config)
    for name, aliases in FIELD_ALIASES.items():
        if name in out:
            continue
        for alias in aliases:
            if alias in out:
                out[name] = out[alias]
                break
    for name, default in (defaults or {}).items():
        if name not in out:
            out[name] = default(out) if callable(default) else default
    return out
