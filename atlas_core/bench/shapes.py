"""Named model shapes for benchmarks (the real configs' sizes, random weights)."""

from __future__ import annotations

from typing import Any

_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
          "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "attention_bias": False,
          "max_position_embeddings": 40960, "vocab_size": 151936, "head_dim": 128,
          "use_sliding_window": False, "sliding_window": None, "initializer_range": 0.02}

SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {**_QWEN3, "hidden_size": 1024, "intermediate_size": 3072,
                   "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
                   "tie_word_embeddings": True},
    "qwen3-8b": {**_QWEN3, "hidden_size": 4096, "intermediate_size": 12288,
                 "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "tie_word_embeddings": False},
    "qwen3-30b-a3b": {**_QWEN3, "architectures": ["Qwen3MoeForCausalLM"],
                      "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                      "num_hidden_layers": 48, "num_attention_heads": 32,
                      "num_key_value_heads": 4, "num_experts": 128, "num_experts_per_tok": 8,
                      "moe_intermediate_size": 768, "decoder_sparse_step": 1,
                      "mlp_only_layers": [], "norm_topk_prob": True,
                      "tie_word_embeddings": False},
    "tiny": {**_QWEN3, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "vocab_size": 384, "max_position_embeddings": 2048, "tie_word_embeddings": False},
    "tiny-moe": {**_QWEN3, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                 "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                 "vocab_size": 384, "max_position_embeddings": 2048, "num_experts": 8,
                 "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 1,
                 "mlp_only_layers": [], "norm_topk_prob": True, "tie_word_embeddings": False},
}


def shape_config(name: str) -> dict[str, Any]:
    """The config.json of a named shape, with a clear error for unknown names."""
    if name not in SHAPES:
        raise KeyError(f"unknown model shape {name!r}; known: {', '.join(SHAPES)} "
                       "(or pass a model directory)")
    return dict(SHAPES[name])


def step_bytes(config: dict[str, Any], context: int, batch: int = 1, itemsize: int = 2) -> int:
    """Fewest bytes one decode step must read: the weights used plus every sequence's KV cache.

    MoE layers count the experts one step can touch: ``min(num_experts, batch * top_k)``.
    The embedding table counts one row per sequence (unless tied to the head).
    """
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim") or h // heads
    vocab = config["vocab_size"]
    attn = h * (heads + 2 * kv_heads) * d + heads * d * h + 2 * d
    if config.get("num_experts"):
        used = min(config["num_experts"], batch * config["num_experts_per_tok"])
        mlp = used * 3 * h * config["moe_intermediate_size"] + h * config["num_experts"]
    else:
        mlp = 3 * h * config["intermediate_size"]
    weights = layers * (attn + mlp + 2 * h) + vocab * h + h
    if not config.get("tie_word_embeddings"):
        weights += batch * h
    kv = batch * context * layers * 2 * kv_heads * d
    return (weights + kv) * itemsize


def step_flops(config: dict[str, Any], tokens: int) -> int:
    """Matmul FLOPs of a forward pass over ``tokens`` tokens (attention scores excluded)."""
    return 2 * tokens * (step_bytes(config, 0) // 2 - config["vocab_size"] * config["hidden_size"]
                         * (0 if config.get("tie_word_embeddings") else 1))
