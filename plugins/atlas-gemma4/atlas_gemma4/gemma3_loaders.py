"""Weight loaders: ``Gemma3ForCausalLM`` and the text model of ``Gemma3ForConditionalGeneration``,
the Gemma-4 layers with Gemma-3's switches."""

from __future__ import annotations

from typing import Any

from atlas_gemma4.loaders import Gemma4Loader, wrapper_config


class Gemma3Loader(Gemma4Loader):
    """``Gemma3ForCausalLM`` (Gemma-3 1B and the text model of larger Gemma-3 checkpoints): the
    Gemma-4 block without ``layer_scalar`` or value norm, zero-centred norm weights, softmax
    scale ``query_pre_attn_scalar ** -0.5``, one head size and KV head count for every layer,
    ``rope_local_base_freq`` on sliding layers. Attention-logit soft-capping is refused."""

    zero_centered_norm = True
    has_v_norm = False
    has_layer_scalar = False
    config_defaults = {
        **Gemma4Loader.config_defaults, "vocab_size": 262208, "num_hidden_layers": 26,
        "sliding_window": 4096, "query_pre_attn_scalar": 256, "global_head_dim": None,
        "hidden_size_per_layer_input": 0, "rope_parameters": None,
        "attn_logit_softcapping": None}

    def validate_config(self, config: dict[str, Any]) -> None:
        super().validate_config(config)
        if self.resolve_config(config).get("attn_logit_softcapping") is not None:
            raise ValueError("config.json 'attn_logit_softcapping' is not supported by "
                             "atlas-gemma4 (Gemma-3 checkpoints set it to null); set it to null")

    def attention_scale(self, config: dict[str, Any]) -> float:
        return float(config["query_pre_attn_scalar"]) ** -0.5

    def rope(self, config: dict[str, Any], kind: str) -> dict[str, Any]:
        params = dict((config.get("rope_parameters") or {}).get(kind) or {})
        if kind == "full_attention" and not params:
            params = dict(config.get("rope_scaling") or {})
            params.setdefault("rope_theta", config.get("rope_theta", 1000000.0))
        elif not params:
            params["rope_theta"] = config.get("rope_local_base_freq", 10000.0)
        params.setdefault("rope_type", params.pop("type", "default"))
        return params

    def tiny_config(self) -> dict[str, Any]:
        return {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
                "vocab_size": 384, "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "query_pre_attn_scalar": 16,
                "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 512,
                "rms_norm_eps": 1e-6, "sliding_window": 8,
                "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                                "full_attention"],
                "rope_parameters": {"sliding_attention": {"rope_type": "default",
                                                          "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                       "rope_theta": 1000000.0}},
                "final_logit_softcapping": None, "attn_logit_softcapping": None,
                "tie_word_embeddings": True, "initializer_range": 0.02}


class Gemma3VLLoader(Gemma3Loader):
    """``Gemma3ForConditionalGeneration`` (Gemma-3 4B/12B/27B): the text model (``text_config``,
    ``model.language_model.*``); the vision tower is skipped."""

    def tiny_config(self) -> dict[str, Any]:
        return wrapper_config(super().tiny_config(), "Gemma3ForConditionalGeneration", "gemma3")
