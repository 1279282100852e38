"""Weight loader of ``NemotronHForCausalLM`` (Nemotron-H, Nemotron-Nano-v2, Nemotron-3 Nano /
Super): a stack of one-mixer blocks, each Mamba-2, attention, squared-ReLU MLP or MoE."""

from __future__ import annotations

import logging
from typing import Any

from atlas_core.api import DecoderOnlyLoader, TransformerLayer, checkpoint_tensors

from atlas_nemotron_h.model import PREFIXES, NemotronHCausalLM, nemotron_block

log = logging.getLogger(__name__)

#: ``hybrid_override_pattern`` characters and every name ``layers_block_type`` has used for a
#: block kind -> the kind.
KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe",
         "mamba": "mamba", "linear_attention": "mamba", "attention": "attention",
         "full_attention": "attention", "mlp": "mlp", "moe": "moe"}

#: Older config.json names of Mamba fields; as in HF's config class, they win when present.
LEGACY_FIELDS = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel",
                 "mamba_chunk_size": "chunk_size", "mamba_dt_limit": "time_step_limit",
                 "mamba_conv_bias": "use_conv_bias"}

#: Fields the Mamba-2 layers need, each a positive integer.
MAMBA_FIELDS = ("mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size",
                "conv_kernel", "chunk_size")
MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
              "moe_shared_expert_intermediate_size")


def layer_kinds(config: dict[str, Any]) -> list[str]:
    """Block kinds (``mamba``, ``attention``, ``mlp``, ``moe``) from ``layers_block_type``,
    else the older ``hybrid_override_pattern`` string.

    Raises:
        ValueError: neither is given, or one names an unknown kind.
    """
    types = config.get("layer_types") or config.get("layers_block_type")
    source = "layers_block_type"
    if types is None:
        types, source = config.get("hybrid_override_pattern"), "hybrid_override_pattern"
    if not types:
        raise ValueError("config.json gives no block layout: set 'layers_block_type' (a list of "
                         "'mamba'/'attention'/'mlp'/'moe') or 'hybrid_override_pattern' "
                         "(a string of M, *, - and E)")
    unknown = sorted({str(t) for t in types} - set(KINDS))
    if unknown:
        raise ValueError(f"config.json {source!r} has unknown block kinds {unknown}; use M/*/-/E "
                         "or mamba/attention/mlp/moe")
    return [KINDS[t] for t in types]


def _json_float(value: Any) -> float:
    """A float of config.json; transformers 5 writes infinities as ``{"__float__": "Infinity"}``."""
    if isinstance(value, dict) and "__float__" in value:
        return float(value["__float__"])
    return float(value)


class NemotronHLoader(DecoderOnlyLoader):
    """``NemotronHForCausalLM``. Tensors are read under ``backbone.`` (released checkpoints) or
    ``model.``; per-expert or stacked expert tensors; multi-token-prediction (``mtp.*``) weights
    are not loaded. The time step is clamped to ``time_step_limit`` in prefill and decode alike
    (HF clamps its prefill path at ``time_step_min`` and its decode path not at all)."""

    #: Tensor prefix of the model body (set from the checkpoint by :meth:`inspect_checkpoint`).
    prefix = PREFIXES[0]
    config_defaults = {
        **DecoderOnlyLoader.config_defaults, "head_dim": 128, "num_key_value_heads": 8,
        "max_position_embeddings": 4096, "intermediate_size": 21504, "mamba_num_heads": 128,
        "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4,
        "chunk_size": 128, "time_step_limit": (0.0, float("inf")), "layer_norm_epsilon": 1e-5,
        "use_conv_bias": True, "use_bias": False, "mlp_bias": False, "mlp_hidden_act": "relu2",
        "mamba_hidden_act": "silu", "num_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 7688, "moe_shared_expert_intermediate_size": 7688,
        "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
        "moe_latent_size": None, "num_attention_heads": 32}

    def resolve_config(self, config: dict[str, Any]) -> dict[str, Any]:
        config = dict(config)
        for old, new in LEGACY_FIELDS.items():
            if old in config:
                config[new] = config[old]
        config = super().resolve_config(config)
        kinds = layer_kinds(config)
        config["layer_types"] = kinds
        config["num_hidden_layers"] = len(kinds)
        return config

    def validate_config(self, config: dict[str, Any]) -> None:
        given = config.get("num_hidden_layers")
        config = self.resolve_config(config)
        if isinstance(given, int) and given != config["num_hidden_layers"]:
            log.warning("config.json num_hidden_layers=%d differs from the %d blocks of its layer "
                        "pattern; using the pattern (as HF does)", given,
                        config["num_hidden_layers"])
        super().validate_config(config)
        kinds = set(config["layer_types"])
        needed = (MAMBA_FIELDS if "mamba" in kinds else ()) + (MOE_FIELDS if "moe" in kinds else ())
        for name in needed:
            if not isinstance(config.get(name), int) or config[name] <= 0:
                raise ValueError(f"config.json field {name!r} must be a positive integer, got "
                                 f"{config.get(name)!r}")
        if kinds & {"mlp", "moe"} and config["mlp_hidden_act"] != "relu2":
            raise ValueError(f"config.json 'mlp_hidden_act' {config['mlp_hidden_act']!r} is not "
                             "supported; Nemotron-H MLPs and experts use 'relu2'")

    def mamba_kwargs(self, config: dict[str, Any], layer_idx: int) -> dict[str, Any]:
        low, high = (_json_float(v) for v in config["time_step_limit"])
        return dict(hidden_size=config["hidden_size"], num_heads=config["mamba_num_heads"],
                    head_dim=config["mamba_head_dim"], n_groups=config["n_groups"],
                    state_size=config["ssm_state_size"], conv_kernel=config["conv_kernel"],
                    chunk_size=config["chunk_size"], time_step_limit=(low, high),
                    eps=config["layer_norm_epsilon"], use_conv_bias=bool(config["use_conv_bias"]),
                    use_bias=bool(config["use_bias"]), hidden_act=config["mamba_hidden_act"])

    def attention_kwargs(self, config: dict[str, Any], layer_idx: int) -> dict[str, Any]:
        return dict(hidden_size=config["hidden_size"], num_heads=config["num_attention_heads"],
                    num_kv_heads=config["num_key_value_heads"], head_dim=self.head_dim(config),
                    max_position_embeddings=self.max_position_embeddings(config))

    def mlp_kwargs(self, config: dict[str, Any], layer_idx: int) -> dict[str, Any]:
        return dict(hidden_size=config["hidden_size"], bias=bool(config["mlp_bias"]),
                    intermediate_size=config["intermediate_size"])

    def moe_kwargs(self, config: dict[str, Any], layer_idx: int) -> dict[str, Any]:
        return dict(hidden_size=config["hidden_size"], num_experts=config["num_experts"],
                    num_experts_per_tok=config["num_experts_per_tok"],
                    moe_intermediate_size=config["moe_intermediate_size"],
                    shared_intermediate_size=config["moe_shared_expert_intermediate_size"],
                    n_group=config["n_group"], topk_group=config["topk_group"],
                    norm_topk_prob=bool(config["norm_topk_prob"]),
                    routed_scaling_factor=config["routed_scaling_factor"],
                    latent_size=config["moe_latent_size"], bias=bool(config["mlp_bias"]))

    def build_layer(self, config: dict[str, Any], layer_idx: int) -> TransformerLayer:
        kind = config["layer_types"][layer_idx]
        factory, kwargs = {
            "mamba": ("mamba2", self.mamba_kwargs), "attention": ("nemotron_h_attention",
                                                                  self.attention_kwargs),
            "mlp": ("relu2_mlp", self.mlp_kwargs), "moe": ("nemotron_h_moe", self.moe_kwargs),
        }[kind]
        mixer = self.layer_factory(factory)(**kwargs(config, layer_idx))
        return nemotron_block(mixer, hidden_size=config["hidden_size"],
                              eps=config["layer_norm_epsilon"])

    def build(self, config: dict[str, Any]) -> NemotronHCausalLM:
        self.validate_config(config)
        config = self.resolve_config(config)
        layers = [self.build_layer(config, i) for i in range(config["num_hidden_layers"])]
        return NemotronHCausalLM(config, layers, prefix=self.prefix,
                                 hidden_size=config["hidden_size"], vocab_size=config["vocab_size"],
                                 rms_norm_eps=config["layer_norm_epsilon"],
                                 max_position_embeddings=self.max_position_embeddings(config))

    def parameter_count(self, config: dict[str, Any]) -> int:
        count = super().parameter_count(config)
        if self.resolve_config(config).get("tie_word_embeddings"):
            count += config["vocab_size"] * config["hidden_size"]
        return count

    def inspect_checkpoint(self, config: dict[str, Any], checkpoint: Any) -> None:
        """The body's tensor prefix (:data:`PREFIXES`, by where the embedding is) for
        :meth:`build`; single-GPU and split loading alike."""
        names = checkpoint.names()
        self.prefix = next((p for p in PREFIXES if f"{p}embeddings.weight" in names), PREFIXES[0])
        mtp = sum(1 for n in names if n.startswith("mtp."))
        if mtp:
            log.info("not loading %d multi-token-prediction (mtp.*) tensors", mtp)

    def checkpoint_tensors(self, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        return checkpoint_tensors(self.build(config))

    def tiny_config(self) -> dict[str, Any]:
        return {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
                "hidden_size": 64, "vocab_size": 384, "max_position_embeddings": 512,
                "layers_block_type": ["mamba", "moe", "attention", "mamba", "mlp", "mamba"],
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                "intermediate_size": 96, "mlp_hidden_act": "relu2", "mamba_num_heads": 8,
                "mamba_head_dim": 8, "n_groups": 2, "ssm_state_size": 16, "conv_kernel": 4,
                "chunk_size": 16, "use_conv_bias": True, "layer_norm_epsilon": 1e-5,
                "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                "moe_shared_expert_intermediate_size": 48, "n_group": 2, "topk_group": 1,
                "norm_topk_prob": True, "routed_scaling_factor": 2.5,
                "tie_word_embeddings": False, "initializer_range": 0.02}
