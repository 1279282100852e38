"""Weight loader of ``Mistral4ForCausalLM`` (Mistral-Small-4 text decoders)."""

from __future__ import annotations

from typing import Any

from atlas_core.api import rope_parameters
from atlas_deepseek.loader import DeepseekV3Loader


def default_rope(config: dict[str, Any]) -> dict[str, Any] | None:
    """HF ``Mistral4Config``'s rope when config.json gives none (yarn x128 over 8192 positions,
    Llama-4 attention scaling with beta 0.1)."""
    if config.get("rope_scaling") or "rope_theta" in config:
        return None
    return {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0,
            "original_max_position_embeddings": 8192, "beta_fast": 32.0, "beta_slow": 1.0,
            "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}


class Mistral4Loader(DeepseekV3Loader):
    """``Mistral4ForCausalLM``: DeepSeek-V3's block (``mla_attention`` then a dense MLP for the
    first ``first_k_dense_replace`` blocks, ``deepseek_moe`` after) with a softmax router and no
    correction bias, and queries scaled by position (``llama_4_scaling_beta``: ``1 + beta *
    log(1 + floor(pos / original_max_position_embeddings))``) as HF ``Mistral4Attention``.
    """

    scoring = "softmax"
    correction_bias = False
    architecture = "Mistral4ForCausalLM"
    config_defaults = {**DeepseekV3Loader.config_defaults, "num_experts": 128,
                       "n_shared_experts": 1, "moe_intermediate_size": 2048,
                       "routed_scaling_factor": 1.0, "kv_lora_rank": 256, "q_lora_rank": 1024,
                       "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 64,
                       "n_group": 1, "topk_group": 1, "num_experts_per_tok": 4,
                       "first_k_dense_replace": 0, "max_position_embeddings": 1048576,
                       "intermediate_size": 12288, "rope_parameters": default_rope}

    def llama4_scaling_beta(self, config: dict[str, Any]) -> float:
        return float(rope_parameters(config).get("llama_4_scaling_beta") or 0.0)

    def tiny_config(self) -> dict[str, Any]:
        return {"architectures": ["Mistral4ForCausalLM"], "model_type": "mistral4",
                "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
                "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
                "n_shared_experts": 1, "n_routed_experts": 8, "routed_scaling_factor": 1.5,
                "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8, "v_head_dim": 16,
                "qk_nope_head_dim": 8, "n_group": 2, "topk_group": 1, "num_experts_per_tok": 2,
                "first_k_dense_replace": 1, "norm_topk_prob": True, "hidden_act": "silu",
                "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "vocab_size": 384,
                "rope_interleave": True, "tie_word_embeddings": False, "initializer_range": 0.02,
                "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 32.0,
                                    "original_max_position_embeddings": 16, "beta_fast": 32.0,
                                    "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                    "llama_4_scaling_beta": 0.1,
                                    "partial_rotary_factor": 0.5}}
