"""Weight loader of ``DeepseekV3ForCausalLM`` (DeepSeek-V3 / V3.1 / R1 and other checkpoints of
that architecture), and the base of every MLA + grouped-MoE family (atlas-mistral's
``Mistral4ForCausalLM``)."""

from __future__ import annotations

import logging
import re
from typing import Any

from atlas_core.api import (CausalLM, DecoderLayer, DecoderOnlyLoader, GatedMLP, resolve,
                            rope_parameters)

from atlas_deepseek.plugin import LAYERS

log = logging.getLogger(__name__)

_LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")


class DeepseekV3Loader(DecoderOnlyLoader):
    """``DeepseekV3ForCausalLM``: every block is multi-head latent attention (``mla_attention``)
    then a dense MLP (the first ``first_k_dense_replace`` blocks) or a ``deepseek_moe`` block
    (sigmoid router with ``e_score_correction_bias``, ``n_group`` / ``topk_group`` group-limited
    top-k, ``routed_scaling_factor``, ``n_shared_experts`` shared experts).

    Multi-token-prediction blocks (``model.layers.{num_hidden_layers + i}.*``) are recognised
    and not loaded. Subclasses change :attr:`scoring`, :attr:`correction_bias` and
    :meth:`llama4_scaling_beta`.
    """

    #: Router score function and whether the router has a correction bias.
    scoring = "sigmoid"
    correction_bias = True
    architecture = "DeepseekV3ForCausalLM"
    config_defaults = {**DecoderOnlyLoader.config_defaults, "num_experts": 256,
                       "n_shared_experts": 1, "moe_intermediate_size": 2048,
                       "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
                       "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
                       "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
                       "first_k_dense_replace": 3, "norm_topk_prob": True, "hidden_act": "silu",
                       "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
                       "rope_interleave": True, "attention_bias": False,
                       "tie_word_embeddings": False, "intermediate_size": 18432}

    def layer_factory(self, kind: str) -> Any:
        if self.registry is not None:
            return self.registry.get("layers", kind)
        return resolve(LAYERS[kind]) if kind in LAYERS else GatedMLP

    def validate_config(self, config: dict[str, Any]) -> None:
        super().validate_config(config)
        config = self.resolve_config(config)
        for name in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                     "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                     "intermediate_size"):
            if not isinstance(config.get(name), int) or config[name] <= 0:
                raise ValueError(f"config.json field {name!r} must be a positive integer for "
                                 f"{self.architecture}, got {config.get(name)!r}")
        q_lora = config.get("q_lora_rank")
        if q_lora is not None and (not isinstance(q_lora, int) or q_lora <= 0):
            raise ValueError(f"config.json 'q_lora_rank' must be a positive integer or null, got "
                             f"{q_lora!r}")
        scoring = config.get("scoring_func", self.scoring)
        if scoring != self.scoring:
            raise ValueError(f"config.json 'scoring_func': {scoring!r} is not supported for "
                             f"{self.architecture}; it routes with {self.scoring!r}")
        method = config.get("topk_method", "noaux_tc")
        if self.correction_bias and method != "noaux_tc":
            raise ValueError(f"config.json 'topk_method': {method!r} is not supported; "
                             f"{self.architecture} routes with 'noaux_tc'")

    def llama4_scaling_beta(self, config: dict[str, Any]) -> float:
        """Query scaling by position (Mistral-4's ``llama_4_scaling_beta``); DeepSeek has none."""
        return 0.0

    def attention_kwargs(self, config: dict[str, Any], layer_idx: int) -> dict[str, Any]:
        return dict(hidden_size=config["hidden_size"], num_heads=config["num_attention_heads"],
                    q_lora_rank=config.get("q_lora_rank"), kv_lora_rank=config["kv_lora_rank"],
                    qk_nope_head_dim=config["qk_nope_head_dim"],
                    qk_rope_head_dim=config["qk_rope_head_dim"], v_head_dim=config["v_head_dim"],
                    rope=rope_parameters(config),
                    max_position_embeddings=self.max_position_embeddings(config),
                    rms_norm_eps=config.get("rms_norm_eps", 1e-6),
                    rope_interleave=bool(config.get("rope_interleave", True)),
                    attention_bias=bool(config.get("attention_bias", False)),
                    llama4_scaling_beta=self.llama4_scaling_beta(config))

    def is_sparse(self, config: dict[str, Any], layer_idx: int) -> bool:
        return layer_idx >= int(config.get("first_k_dense_replace") or 0)

    def moe_kwargs(self, config: dict[str, Any], layer_idx: int) -> dict[str, Any]:
        return dict(hidden_size=config["hidden_size"], num_experts=config["num_experts"],
                    num_experts_per_tok=config["num_experts_per_tok"],
                    moe_intermediate_size=config["moe_intermediate_size"],
                    num_shared_experts=int(config.get("n_shared_experts") or 0),
                    num_groups=int(config.get("n_group") or 1),
                    topk_groups=int(config.get("topk_group") or 1), scoring=self.scoring,
                    correction_bias=self.correction_bias,
                    norm_topk_prob=bool(config.get("norm_topk_prob", True)),
                    routed_scaling_factor=float(config.get("routed_scaling_factor") or 1.0),
                    hidden_act=config.get("hidden_act", "silu"))

    def build_layer(self, config: dict[str, Any], layer_idx: int) -> DecoderLayer:
        attention = self.layer_factory("mla_attention")(**self.attention_kwargs(config, layer_idx))
        if self.is_sparse(config, layer_idx):
            ffn = self.layer_factory("deepseek_moe")(**self.moe_kwargs(config, layer_idx))
        else:
            ffn = self.layer_factory("mlp")(**self.mlp_kwargs(config, layer_idx))
        return DecoderLayer(attention, ffn, hidden_size=config["hidden_size"],
                            rms_norm_eps=config.get("rms_norm_eps", 1e-6))

    def load(self, config: dict[str, Any], checkpoint: Any, backend: Any, *,
             dtype: Any = None) -> CausalLM:
        num_layers = self.resolve_config(config)["num_hidden_layers"]
        mtp = [n for n in checkpoint.names() if _is_mtp(n, num_layers)]
        if mtp:
            log.info("not loading %d multi-token-prediction (MTP) tensors: Atlas does not use "
                     "%s's MTP modules yet", len(mtp), self.architecture)
        return super().load(config, checkpoint, backend, dtype=dtype)

    def tiny_config(self) -> dict[str, Any]:
        return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
                "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
                "n_shared_experts": 1, "n_routed_experts": 8, "routed_scaling_factor": 2.5,
                "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8, "v_head_dim": 16,
                "qk_nope_head_dim": 16, "n_group": 4, "topk_group": 2,
                "num_experts_per_tok": 2, "first_k_dense_replace": 1, "norm_topk_prob": True,
                "hidden_act": "silu", "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
                "vocab_size": 384, "rope_interleave": True, "tie_word_embeddings": False,
                "initializer_range": 0.02,
                "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                    "original_max_position_embeddings": 128, "beta_fast": 32.0,
                                    "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}}


def _is_mtp(name: str, num_layers: int) -> bool:
    """Whether checkpoint tensor ``name`` belongs to an MTP block."""
    match = _LAYER_INDEX.match(name)
    return match is not None and int(match.group(1)) >= num_layers
