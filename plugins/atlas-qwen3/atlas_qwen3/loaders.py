"""Weight loaders: Qwen3 (q/k norm), Qwen3-MoE (sparse layers), Llama and Mistral (no q/k norm)."""

from __future__ import annotations

from typing import Any

from atlas_core.api import DecoderOnlyLoader

_TINY_COMMON = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 384,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "tie_word_embeddings": False, "attention_bias": False, "initializer_range": 0.02,
}


class Qwen3Loader(DecoderOnlyLoader):
    """``Qwen3ForCausalLM``: GQA attention with per-head q/k RMSNorm, SwiGLU MLP."""

    qk_norm = True
    config_defaults = {**DecoderOnlyLoader.config_defaults, "head_dim": 128,
                       "num_key_value_heads": 32, "max_position_embeddings": 32768}

    def validate_config(self, config: dict[str, Any]) -> None:
        super().validate_config(config)
        if config.get("use_sliding_window"):
            raise ValueError("config.json 'use_sliding_window': true is not supported; set it to "
                             "false (Qwen3 checkpoints are trained without it)")

    def tiny_config(self) -> dict[str, Any]:
        return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **_TINY_COMMON,
                "rope_theta": 1000000.0, "use_sliding_window": False, "sliding_window": None}


class Qwen3MoeLoader(Qwen3Loader):
    """``Qwen3MoeForCausalLM``: Qwen3 attention; sparse MoE feed-forward on the layers selected by
    ``decoder_sparse_step`` and not in ``mlp_only_layers`` (dense ``intermediate_size`` MLP there)."""

    config_defaults = {**DecoderOnlyLoader.config_defaults, "num_key_value_heads": 4,
                       "max_position_embeddings": 32768, "norm_topk_prob": False}

    def validate_config(self, config: dict[str, Any]) -> None:
        super().validate_config(config)
        config = self.resolve_config(config)
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            if not isinstance(config.get(name), int) or config[name] <= 0:
                raise ValueError(f"config.json field {name!r} must be a positive integer for "
                                 f"Qwen3MoeForCausalLM, got {config.get(name)!r}")

    def is_sparse(self, config: dict[str, Any], layer_idx: int) -> bool:
        step = config.get("decoder_sparse_step", 1) or 1
        return (layer_idx not in (config.get("mlp_only_layers") or [])
                and config.get("num_experts", 0) > 0 and (layer_idx + 1) % step == 0)

    def tiny_config(self) -> dict[str, Any]:
        return {**super().tiny_config(), "architectures": ["Qwen3MoeForCausalLM"],
                "model_type": "qwen3_moe", "num_hidden_layers": 3, "num_experts": 8,
                "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 1,
                "mlp_only_layers": [1], "norm_topk_prob": True, "output_router_logits": False}


class LlamaLoader(DecoderOnlyLoader):
    """``LlamaForCausalLM``: GQA attention without q/k norm; optional biases; llama3 rope scaling."""

    config_defaults = {**DecoderOnlyLoader.config_defaults, "max_position_embeddings": 2048}

    def tiny_config(self) -> dict[str, Any]:
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **_TINY_COMMON,
                "mlp_bias": False, "rope_theta": 500000.0,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}


class MistralLoader(DecoderOnlyLoader):
    """``MistralForCausalLM``: the Llama stack. A ``sliding_window`` shorter than the context caps
    the usable context at the window, where full attention is exactly sliding-window attention."""

    config_defaults = {**DecoderOnlyLoader.config_defaults, "num_key_value_heads": 8,
                       "max_position_embeddings": 131072, "sliding_window": 4096}

    def max_position_embeddings(self, config: dict[str, Any]) -> int:
        limit = super().max_position_embeddings(config)
        window = config.get("sliding_window")
        return min(limit, int(window)) if window else limit

    def tiny_config(self) -> dict[str, Any]:
        return {"architectures": ["MistralForCausalLM"], "model_type": "mistral", **_TINY_COMMON,
                "rope_theta": 1000000.0, "sliding_window": None}
