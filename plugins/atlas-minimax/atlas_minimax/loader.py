"""Weight loader of ``MiniMaxM2ForCausalLM`` (MiniMax-M2, M2.5 and M2.7 checkpoints)."""

from __future__ import annotations

import logging
import re
from typing import Any

from atlas_core.api import CausalLM, DecoderLayer, DecoderOnlyLoader, resolve, rope_parameters

from atlas_minimax.plugin import LAYERS

log = logging.getLogger(__name__)

_LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")


class MiniMaxM2Loader(DecoderOnlyLoader):
    """``MiniMaxM2ForCausalLM``: every block is full attention (GQA, q/k RMSNorm over the whole
    projection, partial rotary from ``rotary_dim``) and a sparse MoE (``num_local_experts``
    experts of width ``intermediate_size``, sigmoid router plus ``e_score_correction_bias``).

    Multi-token-prediction modules (``num_mtp_modules`` blocks stored after the last layer as
    ``model.layers.{num_hidden_layers + i}.*``, or under ``mtp``) are recognised and not loaded.
    """

    config_defaults = {**DecoderOnlyLoader.config_defaults, "head_dim": 128,
                       "num_key_value_heads": 8, "max_position_embeddings": 196608,
                       "intermediate_size": 1536, "num_experts": 256, "num_experts_per_tok": 8,
                       "rope_theta": 5000000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu",
                       "tie_word_embeddings": False}

    def layer_factory(self, kind: str) -> Any:
        if self.registry is not None:
            return self.registry.get("layers", kind)
        return resolve(LAYERS[kind])

    def validate_config(self, config: dict[str, Any]) -> None:
        super().validate_config(config)
        config = self.resolve_config(config)
        for name, shown in (("num_experts", "num_local_experts"),
                            ("num_experts_per_tok", "num_experts_per_tok"),
                            ("intermediate_size", "intermediate_size")):
            if not isinstance(config.get(name), int) or config[name] <= 0:
                raise ValueError(f"config.json field {shown!r} must be a positive integer for "
                                 f"MiniMaxM2ForCausalLM, got {config.get(name)!r}")
        if config.get("scoring_func", "sigmoid") != "sigmoid":
            raise ValueError(f"config.json 'scoring_func': {config['scoring_func']!r} is not "
                             "supported; MiniMax-M2 routes with 'sigmoid'")
        if config.get("shared_intermediate_size"):
            raise ValueError("config.json 'shared_intermediate_size' > 0 (a shared expert) is not "
                             "supported for MiniMaxM2ForCausalLM; released M2 checkpoints use 0")
        kinds = set(config.get("attn_type_list") or [1])
        if kinds != {1}:
            raise ValueError("config.json 'attn_type_list' asks for lightning-attention layers "
                             "(0); MiniMaxM2ForCausalLM supports full attention (1) only")

    def rope(self, config: dict[str, Any]) -> dict[str, Any]:
        """Rope settings; a legacy ``rotary_dim`` becomes ``partial_rotary_factor`` as in HF."""
        params = rope_parameters(config)
        given = [config, config.get("rope_parameters") or {}, config.get("rope_scaling") or {}]
        rotary_dim = config.get("rotary_dim")
        if rotary_dim and not any("partial_rotary_factor" in d for d in given):
            params["partial_rotary_factor"] = rotary_dim / self.head_dim(config)
        return params

    def attention_kwargs(self, config: dict[str, Any], layer_idx: int) -> dict[str, Any]:
        if config.get("attention_bias"):
            raise ValueError("config.json 'attention_bias': true is not supported for "
                             "MiniMaxM2ForCausalLM; set it to false (M2 has no attention biases)")
        return dict(hidden_size=config["hidden_size"], num_heads=config["num_attention_heads"],
                    num_kv_heads=config["num_key_value_heads"], head_dim=self.head_dim(config),
                    rope=self.rope(config),
                    max_position_embeddings=self.max_position_embeddings(config),
                    rms_norm_eps=config.get("rms_norm_eps", 1e-6))

    def moe_kwargs(self, config: dict[str, Any], layer_idx: int) -> dict[str, Any]:
        return dict(hidden_size=config["hidden_size"], num_experts=config["num_experts"],
                    num_experts_per_tok=config["num_experts_per_tok"],
                    intermediate_size=config["intermediate_size"],
                    hidden_act=config.get("hidden_act", "silu"))

    def build_layer(self, config: dict[str, Any], layer_idx: int) -> DecoderLayer:
        attention = self.layer_factory("minimax_m2_attention")(
            **self.attention_kwargs(config, layer_idx))
        moe = self.layer_factory("minimax_m2_moe")(**self.moe_kwargs(config, layer_idx))
        return DecoderLayer(attention, moe, hidden_size=config["hidden_size"],
                            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
                            ffn_name="block_sparse_moe")

    def load(self, config: dict[str, Any], checkpoint: Any, backend: Any, *,
             dtype: Any = None) -> CausalLM:
        num_layers = self.resolve_config(config)["num_hidden_layers"]
        mtp = [n for n in checkpoint.names() if _is_mtp(n, num_layers)]
        if mtp:
            log.info("not loading %d multi-token-prediction (MTP) tensors: Atlas does not use "
                     "MiniMax-M2's MTP modules yet", len(mtp))
        return super().load(config, checkpoint, backend, dtype=dtype)

    def tiny_config(self) -> dict[str, Any]:
        return {"architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2",
                "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 3,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                "vocab_size": 384, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
                "hidden_act": "silu", "num_local_experts": 8, "num_experts_per_tok": 2,
                "rotary_dim": 8, "rope_theta": 10000.0, "tie_word_embeddings": False,
                "initializer_range": 0.02, "scoring_func": "sigmoid", "use_qk_norm": True,
                "use_routing_bias": True, "attn_type_list": [1, 1, 1]}


def _is_mtp(name: str, num_layers: int) -> bool:
    """Whether checkpoint tensor ``name`` belongs to an MTP module."""
    match = _LAYER_INDEX.match(name)
    if match is not None:
        return int(match.group(1)) >= num_layers
    return name.startswith(("mtp.", "model.mtp"))
