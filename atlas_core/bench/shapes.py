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
    # GQA groups of 5 (40 / 8): its decode attention takes the whole group a tile
    "qwen3-14b": {**_QWEN3, "hidden_size": 5120, "intermediate_size": 17408,
                  "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 8,
                  "tie_word_embeddings": False},
    "qwen3-30b-a3b": {**_QWEN3, "architectures": ["Qwen3MoeForCausalLM"],
                      "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                      "num_hidden_layers": 48, "num_attention_heads": 32,
                      "num_key_value_heads": 4, "num_experts": 128, "num_experts_per_tok": 8,
                      "moe_intermediate_size": 768, "decoder_sparse_step": 1,
                      "mlp_only_layers": [], "norm_topk_prob": True,
                      "tie_word_embeddings": False},
    # Qwen3-235B-A22B's published config: 470 GB in bf16, the multi-GPU target (-tp 4 on
    # 141 GB GPUs, or -tp 8; a shard per rank made on its GPU, docs/multi-gpu.md)
    "qwen3-235b-a22b": {**_QWEN3, "architectures": ["Qwen3MoeForCausalLM"],
                        "model_type": "qwen3_moe", "hidden_size": 4096,
                        "intermediate_size": 12288, "num_hidden_layers": 94,
                        "num_attention_heads": 64, "num_key_value_heads": 4, "num_experts": 128,
                        "num_experts_per_tok": 8, "moe_intermediate_size": 1536,
                        "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
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

_QWEN35_MOE = {"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
               "hidden_act": "silu", "rms_norm_eps": 1e-6, "attention_bias": False,
               "attn_output_gate": True, "initializer_range": 0.02, "linear_conv_kernel_dim": 4,
               "mlp_only_layers": [], "norm_topk_prob": True, "tie_word_embeddings": False,
               "decoder_sparse_step": 1}


def _hybrid_layers(n: int) -> list[str]:
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]


SHAPES["qwen3.5-35b-a3b"] = {
    **_QWEN35_MOE, "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40,
    "layer_types": _hybrid_layers(40), "num_attention_heads": 16, "num_key_value_heads": 2,
    "head_dim": 256, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 256,
    "num_experts_per_tok": 8, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "max_position_embeddings": 262144,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                        "partial_rotary_factor": 0.25, "mrope_interleaved": True,
                        "mrope_section": [11, 11, 10]}}
SHAPES["tiny-qwen3.5-moe"] = {
    **SHAPES["qwen3.5-35b-a3b"], "vocab_size": 384, "hidden_size": 64, "num_hidden_layers": 4,
    "layer_types": _hybrid_layers(4), "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "num_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "max_position_embeddings": 2048,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                        "partial_rotary_factor": 0.25, "mrope_interleaved": True,
                        "mrope_section": [2, 1, 1]}}

#: Qwen3-VL-30B-A3B (atlas-qwen3vl): the Qwen3-30B-A3B text stack with interleaved MRoPE
#: around a 27-block vision tower (DeepStack from blocks 8, 16, 24); ``atlas bench`` adds the
#: encode time of one image and the TTFT of image + 100 tokens. ``tiny-qwen3-vl`` for CI.
_VL_TOKENS = {"image_token_id": 151655, "video_token_id": 151656,
              "vision_start_token_id": 151652, "vision_end_token_id": 151653}
SHAPES["qwen3-vl-30b-a3b"] = {
    "architectures": ["Qwen3VLMoeForConditionalGeneration"], "model_type": "qwen3_vl_moe",
    **_VL_TOKENS, "tie_word_embeddings": False,
    "text_config": {**SHAPES["qwen3-30b-a3b"], "model_type": "qwen3_vl_moe_text",
                    "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                        "mrope_section": [24, 20, 20],
                                        "mrope_interleaved": True}},
    "vision_config": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                      "num_heads": 16, "out_hidden_size": 2048, "patch_size": 16,
                      "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3,
                      "num_position_embeddings": 2304, "hidden_act": "gelu_pytorch_tanh",
                      "deepstack_visual_indexes": [8, 16, 24]}}
SHAPES["tiny-qwen3-vl"] = {
    "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
    "image_token_id": 383, "video_token_id": 380, "vision_start_token_id": 381,
    "vision_end_token_id": 382, "tie_word_embeddings": False,
    "text_config": {**SHAPES["tiny"], "model_type": "qwen3_vl_text",
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                        "mrope_section": [4, 2, 2], "mrope_interleaved": True}},
    "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                      "out_hidden_size": 64, "patch_size": 16, "spatial_merge_size": 2,
                      "temporal_patch_size": 2, "in_channels": 3, "num_position_embeddings": 16,
                      "hidden_act": "gelu_pytorch_tanh", "deepstack_visual_indexes": [0]}}

#: Gemma-4 text models (atlas-gemma4): 5 sliding (window 1024, head 256) : 1 full (head 512,
#: keys reused as values) layers, soft-capped logits, tied embeddings.
_GEMMA4 = {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
           "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "vocab_size": 262144,
           "head_dim": 256, "global_head_dim": 512, "attention_k_eq_v": True,
           "sliding_window": 1024, "final_logit_softcapping": 30.0,
           "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0,
           "tie_word_embeddings": True, "max_position_embeddings": 262144,
           "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                               "full_attention": {"rope_type": "proportional", "rope_theta": 1e6,
                                                  "partial_rotary_factor": 0.25}}}
SHAPES["gemma-4-31b"] = {
    **_GEMMA4, "hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 60,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10,
    "num_attention_heads": 32, "num_key_value_heads": 16, "num_global_key_value_heads": 4}
SHAPES["gemma-4-26b-a4b"] = {
    **_GEMMA4, "hidden_size": 2816, "intermediate_size": 2112, "num_hidden_layers": 30,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5,
    "num_attention_heads": 16, "num_key_value_heads": 8, "num_global_key_value_heads": 2,
    "max_position_embeddings": 131072, "enable_moe_block": True, "num_experts": 128,
    "top_k_experts": 8, "moe_intermediate_size": 704}

#: MiniMax-M2 / M2.5 / M2.7 (atlas-minimax) cut to 5 of its 62 layers so it fits one 80 GB GPU
#: in bf16: 3.67B parameters (7.34 GB) a layer, 39.2 GB with the 2.46 GB embeddings and head,
#: plus 4 KiB of KV a token a layer (batch 32 at 32k context: 20 GiB). The full model is the
#: multi-GPU target. ``moe_intermediate_size`` is for :func:`step_bytes` only (HF's expert
#: width is ``intermediate_size``).
SHAPES["minimax-m2"] = {
    "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2", "hidden_act": "silu",
    "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 1536,
    "num_hidden_layers": 5, "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
    "rotary_dim": 64, "rope_theta": 5000000.0, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 196608, "num_local_experts": 256, "num_experts": 256,
    "num_experts_per_tok": 8, "moe_intermediate_size": 1536, "scoring_func": "sigmoid",
    "use_routing_bias": True, "tie_word_embeddings": False}

#: Multi-head latent attention MoE models (atlas-deepseek, atlas-mistral), cut to what fits one
#: 80 GB GPU in bf16. Their KV cache is the latent: kv_lora_rank + qk_rope_head_dim values a
#: token a layer (DeepSeek-V3: 576, 1152 bytes; Mistral-Small-4: 320, 640 bytes).
#: ``deepseek-v3``: 3 of 61 layers (one dense, then 2 MoE): 25.5B parameters (50.9 GB); a
#: decode step at batch 1 reads 1.17 GB per MoE layer. ``mistral-small-4``: 8 of 36 layers:
#: 27.3B parameters (54.5 GB), 0.31 GB per layer at batch 1. ``num_experts`` is for
#: :func:`step_bytes` (HF reads ``n_routed_experts``).
SHAPES["deepseek-v3"] = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_act": "silu",
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 3, "num_attention_heads": 128,
    "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "num_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8,
    "topk_group": 4, "num_experts_per_tok": 8, "first_k_dense_replace": 1, "norm_topk_prob": True,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-6, "rope_interleave": True, "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}
SHAPES["mistral-small-4"] = {
    "architectures": ["Mistral4ForCausalLM"], "model_type": "mistral4", "hidden_act": "silu",
    "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 12288,
    "moe_intermediate_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 32,
    "num_key_value_heads": 32, "n_shared_experts": 1, "n_routed_experts": 128,
    "num_experts": 128, "routed_scaling_factor": 1.0, "kv_lora_rank": 256, "q_lora_rank": 1024,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 64, "n_group": 1,
    "topk_group": 1, "num_experts_per_tok": 4, "first_k_dense_replace": 0,
    "norm_topk_prob": True, "max_position_embeddings": 1048576, "rms_norm_eps": 1e-6,
    "rope_interleave": True, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0,
                        "original_max_position_embeddings": 8192, "beta_fast": 32.0,
                        "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                        "llama_4_scaling_beta": 0.1}}

#: Nemotron-3 Nano 30B-A3B (atlas-nemotron-h): 23 Mamba-2, 23 MoE and 6 attention (no RoPE)
#: blocks of width 2688; 128 squared-ReLU experts (top 6, scaled 2.5) plus a shared one.
#: 31.3B parameters (62.5 GB bf16), 3.26B active a token; 6 KiB of KV a token and 2.1 MB of
#: Mamba state a sequence per layer. :func:`step_bytes` does not model Mamba-2 blocks; the
#: bench's floor counts the loaded model's own parameters (``StepBytes``).
_NANO3_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
SHAPES["nemotron-3-nano-30b-a3b"] = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": 131072,
    "hidden_size": 2688, "hybrid_override_pattern": _NANO3_PATTERN,
    "num_hidden_layers": len(_NANO3_PATTERN), "num_attention_heads": 32,
    "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 1856,
    "mamba_num_heads": 64, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8,
    "conv_kernel": 4, "chunk_size": 128, "use_conv_bias": True, "mamba_hidden_act": "silu",
    "n_routed_experts": 128, "num_experts": 128, "num_experts_per_tok": 6,
    "moe_intermediate_size": 1856, "moe_shared_expert_intermediate_size": 3712, "n_group": 1,
    "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
    "mlp_hidden_act": "relu2", "layer_norm_epsilon": 1e-5, "max_position_embeddings": 262144,
    "tie_word_embeddings": False}

#: Checkpoint quantization of the quantized shapes (random codes filled on the device; the
#: projections and expert stacks quantized, embeddings / lm_head / routers in bf16).
FP8_BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
             "weight_block_size": [128, 128]}
NVFP4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
for _base, _quant in (("qwen3-8b", "fp8"), ("qwen3-8b", "nvfp4"), ("qwen3-30b-a3b", "fp8"),
                      ("qwen3-235b-a22b", "fp8"), ("qwen3.5-35b-a3b", "nvfp4")):
    SHAPES[f"{_base}-{_quant}"] = {**SHAPES[_base], "quantization_config":
                                   dict(FP8_BLOCK if _quant == "fp8" else NVFP4)}


def shape_config(name: str) -> dict[str, Any]:
    """The config.json of a named shape, with a clear error for unknown names."""
    if name not in SHAPES:
        raise KeyError(f"unknown model shape {name!r}; known: {', '.join(SHAPES)} "
                       "(or pass a model directory)")
    return dict(SHAPES[name])


def _mla_params(config: dict[str, Any]) -> tuple[int, int]:
    """(parameters of one multi-head latent attention layer, latent elements per token)."""
    h, heads, rank = config["hidden_size"], config["num_attention_heads"], config["kv_lora_rank"]
    rope, nope, v = config["qk_rope_head_dim"], config["qk_nope_head_dim"], config["v_head_dim"]
    q_lora = config.get("q_lora_rank")
    q = h * heads * (nope + rope) if not q_lora else q_lora * (h + 1 + heads * (nope + rope))
    return q + h * (rank + rope) + rank + rank * heads * (nope + v) + heads * v * h, rank + rope


def _attention_params(config: dict[str, Any]) -> tuple[int, int]:
    """(parameters of one full-attention layer, KV elements per token of context)."""
    if config.get("kv_lora_rank"):
        return _mla_params(config)
    h, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    d = config.get("head_dim") or h // heads
    q_rows = heads * d * (2 if config.get("attn_output_gate") else 1)
    return h * (q_rows + 2 * kv_heads * d) + heads * d * h + 2 * d, 2 * kv_heads * d


def _gdn_params(config: dict[str, Any]) -> tuple[int, int]:
    """(parameters of one Gated DeltaNet layer, float32 state elements per sequence)."""
    h, kern = config["hidden_size"], config.get("linear_conv_kernel_dim", 4)
    nk, nv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
    conv_dim = 2 * nk * dk + nv * dv
    params = h * (conv_dim + nv * dv + 2 * nv) + conv_dim * kern + 2 * nv + dv + nv * dv * h
    return params, (kern - 1) * conv_dim + nv * dk * dv


def _ffn_params(config: dict[str, Any], batch: int) -> int:
    """Parameters one step reads in one feed-forward (MoE: the experts ``batch`` tokens touch,
    plus the dense MLP Gemma-4's ``enable_moe_block`` runs beside them)."""
    h = config["hidden_size"]
    if not config.get("num_experts"):
        return 3 * h * config["intermediate_size"]
    top_k = config.get("num_experts_per_tok") or config["top_k_experts"]
    used = min(config["num_experts"], batch * top_k)
    shared = (config.get("shared_expert_intermediate_size")
              or (config.get("n_shared_experts") or 0) * config["moe_intermediate_size"])
    dense = 3 * h * config["intermediate_size"] if config.get("enable_moe_block") else 0
    return (used * 3 * h * config["moe_intermediate_size"] + h * config["num_experts"]
            + (3 * h * shared + h if shared else 0) + dense)


def step_bytes(config: dict[str, Any], context: int, batch: int = 1, itemsize: int = 2) -> int:
    """Fewest bytes one decode step must move: the weights used plus every sequence's KV cache
    (read) and recurrent state (float32, read and written).

    MoE layers count the experts one step can touch: ``min(num_experts, batch * top_k)``.
    The embedding table counts one row per sequence (unless tied to the head). Hybrid configs
    (``layer_types`` with ``linear_attention``) count Gated DeltaNet layers and their state.
    """
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    types = config.get("layer_types") or ["full_attention"] * layers
    attn, kv_per_token = _attention_params(config)
    full = sum(1 for t in types if t != "linear_attention")
    gdn, state = _gdn_params(config) if full < layers else (0, 0)
    mixers = full * attn + (layers - full) * gdn
    weights = mixers + layers * (_ffn_params(config, batch) + 2 * h) + config["vocab_size"] * h + h
    if config.get("num_experts") and config.get("first_k_dense_replace"):
        dense = min(layers, config["first_k_dense_replace"])
        weights += dense * (3 * h * config["intermediate_size"] - _ffn_params(config, batch))
    if not config.get("tie_word_embeddings"):
        weights += batch * h
    kv = batch * context * full * kv_per_token
    return (weights + kv) * itemsize + batch * (layers - full) * state * 4 * 2


def step_flops(config: dict[str, Any], tokens: int) -> int:
    """Matmul FLOPs of a forward pass over ``tokens`` tokens (attention scores excluded)."""
    weights = step_bytes(config, 0) // 2 - config["vocab_size"] * config["hidden_size"]
    return 2 * tokens * (weights + (config["vocab_size"] * config["hidden_size"]
                                    if config.get("tie_word_embeddings") else 0))


#: Layers of the released models the bench shapes cut to fit one GPU in bf16 (the full models
#: are the multi-GPU targets).
FULL_LAYERS = {"minimax-m2": 62, "deepseek-v3": 61, "mistral-small-4": 36}


def shape_note(name: str, config: dict[str, Any]) -> str:
    """One line on a named shape for the bench report: its layers (of the released model's, when
    cut) and the weight bytes a decode step reads at batch 1 per layer and besides them (the
    embedding row, the head); ``""`` for a model that is not a named shape."""
    if name not in SHAPES:
        return ""
    config = config.get("text_config", config)
    layers = int(config["num_hidden_layers"])
    total = step_bytes(config, 0, 1)
    rest = step_bytes({**config, "num_hidden_layers": 0}, 0, 1)
    cut = (f" of the released model's {FULL_LAYERS[name]} (cut to fit one GPU in bf16)"
           if name in FULL_LAYERS else "")
    return (f"shape {name}: {layers} layers{cut}; weights a decode step reads at batch 1: "
            f"{_size((total - rest) / layers)} a layer (mean), {_size(rest)} besides")


def _size(nbytes: float) -> str:
    return f"{nbytes / 1e9:.3f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.3f} MB"
