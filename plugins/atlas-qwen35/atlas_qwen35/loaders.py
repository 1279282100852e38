"""Weight loaders: Qwen3-Next, Qwen3.5 (dense and MoE) and the text path of their VL wrappers.

All three are hybrid stacks: ``layer_types`` picks Gated DeltaNet (``linear_attention``) or gated
full attention (``full_attention``) per block; every RMSNorm except the GDN output norm stores
``w - 1``. Vision-tower weights are not loaded; a complete multi-token-prediction head
(``mtp.*``, see :meth:`Qwen3NextLoader.build_mtp`) is, as ``model.mtp``, for speculative
decoding.
"""

from __future__ import annotations

import logging
from typing import Any

from atlas_core.api import (CausalLM, DecoderLayer, DecoderOnlyLoader, MTPHead, TransformerLayer,
                            checkpoint_tensors, rope_parameters)

log = logging.getLogger(__name__)

#: Checkpoint prefixes of weights the text model does not use, with what they are.
SKIPPED_PREFIXES = (("mtp.", "multi-token-prediction (MTP) head"),
                    ("model.visual.", "vision tower"), ("visual.", "vision tower"))

LINEAR_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                 "linear_value_head_dim", "linear_conv_kernel_dim")


class Qwen3NextLoader(DecoderOnlyLoader):
    """``Qwen3NextForCausalLM``: GDN + gated attention, MoE with a gated shared expert on the
    layers selected by ``decoder_sparse_step`` and not in ``mlp_only_layers``."""

    layout = "qwen3_next"
    skipped_prefixes = SKIPPED_PREFIXES
    fused_experts = False
    zero_centered_norm = True
    config_defaults = {**DecoderOnlyLoader.config_defaults, "head_dim": 256,
                       "num_key_value_heads": 2, "max_position_embeddings": 32768,
                       "norm_topk_prob": True, "shared_expert_intermediate_size": 512}

    def layer_types(self, config: dict[str, Any]) -> list[str]:
        types = config.get("layer_types")
        if types is None:
            interval = int(config.get("full_attention_interval", 4))
            types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                     for i in range(config["num_hidden_layers"])]
        return list(types)

    def validate_config(self, config: dict[str, Any]) -> None:
        super().validate_config(config)
        config = self.resolve_config(config)
        types = self.layer_types(config)
        if len(types) != config["num_hidden_layers"]:
            raise ValueError(f"config.json 'layer_types' has {len(types)} entries for "
                             f"num_hidden_layers={config['num_hidden_layers']}; give one per layer")
        unknown = sorted(set(types) - {"linear_attention", "full_attention"})
        if unknown:
            raise ValueError(f"config.json 'layer_types' has unsupported {unknown}; use "
                             "'linear_attention' or 'full_attention'")
        if "linear_attention" in types:
            for name in LINEAR_FIELDS:
                if not isinstance(config.get(name), int) or config[name] <= 0:
                    raise ValueError(f"config.json field {name!r} must be a positive integer, "
                                     f"got {config.get(name)!r}")
        if config.get("attention_bias"):
            raise ValueError("config.json 'attention_bias': true is not supported for this "
                             "architecture; set it to false")

    def rope(self, config: dict[str, Any]) -> dict[str, Any]:
        params = rope_parameters(config)
        given = [config, config.get("rope_parameters") or {}, config.get("rope_scaling") or {}]
        if not any("partial_rotary_factor" in d for d in given):
            params["partial_rotary_factor"] = 0.25
        return params

    def attention_kwargs(self, config: dict[str, Any], layer_idx: int) -> dict[str, Any]:
        kwargs = super().attention_kwargs(config, layer_idx)
        kwargs.update(rope=self.rope(config), qk_norm=True,
                      attn_output_gate=bool(config.get("attn_output_gate", True)))
        return kwargs

    def gdn_kwargs(self, config: dict[str, Any], layer_idx: int) -> dict[str, Any]:
        return dict(hidden_size=config["hidden_size"], num_k_heads=config["linear_num_key_heads"],
                    num_v_heads=config["linear_num_value_heads"],
                    head_k_dim=config["linear_key_head_dim"],
                    head_v_dim=config["linear_value_head_dim"],
                    conv_kernel_size=config["linear_conv_kernel_dim"],
                    rms_norm_eps=config.get("rms_norm_eps", 1e-6),
                    hidden_act=config.get("hidden_act", "silu"), layout=self.layout)

    def is_sparse(self, config: dict[str, Any], layer_idx: int) -> bool:
        step = config.get("decoder_sparse_step", 1) or 1
        return (layer_idx not in (config.get("mlp_only_layers") or [])
                and (config.get("num_experts") or 0) > 0 and (layer_idx + 1) % step == 0)

    def moe_kwargs(self, config: dict[str, Any], layer_idx: int) -> dict[str, Any]:
        return dict(super().moe_kwargs(config, layer_idx), fused_checkpoint=self.fused_experts,
                    shared_expert_intermediate_size=config.get("shared_expert_intermediate_size", 0))

    def build_layer(self, config: dict[str, Any], layer_idx: int) -> TransformerLayer:
        if self.layer_types(config)[layer_idx] == "linear_attention":
            mixer = self.layer_factory("gated_deltanet")(**self.gdn_kwargs(config, layer_idx))
            mixer_name = "linear_attn"
        else:
            mixer = self.layer_factory("gated_attention")(**self.attention_kwargs(config, layer_idx))
            mixer_name = "self_attn"
        if self.is_sparse(config, layer_idx):
            ffn = self.layer_factory("moe_shared_expert")(**self.moe_kwargs(config, layer_idx))
        else:
            ffn = self.layer_factory("mlp")(**self.mlp_kwargs(config, layer_idx))
        return DecoderLayer(mixer, ffn, hidden_size=config["hidden_size"], mixer_name=mixer_name,
                            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
                            zero_centered=self.zero_centered_norm)

    def build_mtp(self, config: dict[str, Any], model: CausalLM | None) -> MTPHead:
        """The MTP head (``mtp.*``; ``mtp_num_hidden_layers`` in Qwen3.5 configs,
        ``num_nextn_predict_layers`` in Qwen3-Next's): zero-centred ``pre_fc_norm_embedding``
        and ``pre_fc_norm_hidden``, ``fc`` ``[hidden, 2 * hidden]`` over their concatenation
        (embedding first), one gated full-attention block with the feed-forward of layer 0's
        kind (``layers.0.*``) and ``norm``; embedding and ``lm_head`` are the model's. HF
        transformers does not load these tensors; vLLM's ``qwen3_next_mtp`` and ``qwen3_5_mtp``
        define the same forward."""
        attention = self.layer_factory("gated_attention")(**self.attention_kwargs(config, 0))
        if self.is_sparse(config, 0):
            ffn = self.layer_factory("moe_shared_expert")(**self.moe_kwargs(config, 0))
        else:
            ffn = self.layer_factory("mlp")(**self.mlp_kwargs(config, 0))
        eps = config.get("rms_norm_eps", 1e-6)
        layer = DecoderLayer(attention, ffn, hidden_size=config["hidden_size"], rms_norm_eps=eps,
                             zero_centered=self.zero_centered_norm)
        return MTPHead(layer, hidden_size=config["hidden_size"], rms_norm_eps=eps,
                       zero_centered=self.zero_centered_norm,
                       embed_tokens=lambda: model.params["model.embed_tokens.weight"])

    def load(self, config: dict[str, Any], checkpoint: Any, backend: Any, *,
             dtype: Any = None) -> CausalLM:
        names = checkpoint.names()
        with_mtp = self.has_mtp_head(config, checkpoint)
        for prefix, what in self.skipped_prefixes:
            skipped = sum(1 for n in names if n.startswith(prefix))
            if skipped and not (with_mtp and prefix == "mtp."):
                log.info("not loading %d %s tensors (%s*): Atlas serves the text model only",
                         skipped, what, prefix)
        return super().load(config, checkpoint, backend, dtype=dtype)

    def checkpoint_tensors(self, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        text = config.get("text_config")
        if not isinstance(text, dict):
            return checkpoint_tensors(self.build(config))
        shapes = checkpoint_tensors(self.build(text))
        return {("model.language_model." + n[len("model."):] if n.startswith("model.") else n): s
                for n, s in shapes.items()}

    def tiny_config(self) -> dict[str, Any]:
        return {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
                **TINY_TEXT, "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                "shared_expert_intermediate_size": 32, "decoder_sparse_step": 1,
                "mlp_only_layers": [1], "norm_topk_prob": True, "tie_word_embeddings": False}


TINY_TEXT = {
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 384,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "attention_bias": False, "initializer_range": 0.02, "linear_conv_kernel_dim": 4,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
}

ROPE_3_5 = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
            "mrope_interleaved": True, "mrope_section": [2, 1, 1]}


class Qwen3_5Loader(Qwen3NextLoader):
    """``Qwen3_5ForCausalLM``: split GDN projections, dense SwiGLU MLP on every layer."""

    layout = "qwen3_5"
    config_defaults = {**DecoderOnlyLoader.config_defaults, "head_dim": 256,
                       "num_key_value_heads": 4, "max_position_embeddings": 32768}

    def is_sparse(self, config: dict[str, Any], layer_idx: int) -> bool:
        return False

    def tiny_config(self) -> dict[str, Any]:
        return {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
                **TINY_TEXT, "rope_parameters": dict(ROPE_3_5), "attn_output_gate": True,
                "tie_word_embeddings": True}


class Qwen3_5MoeLoader(Qwen3_5Loader):
    """``Qwen3_5MoeForCausalLM``: every layer is sparse (renormalised top-k, gated shared expert);
    expert weights come fused (``experts.gate_up_proj``) or per expert."""

    fused_experts = True
    config_defaults = {**DecoderOnlyLoader.config_defaults, "head_dim": 256,
                       "num_key_value_heads": 2, "max_position_embeddings": 32768,
                       "shared_expert_intermediate_size": 512}

    def is_sparse(self, config: dict[str, Any], layer_idx: int) -> bool:
        return True

    def moe_kwargs(self, config: dict[str, Any], layer_idx: int) -> dict[str, Any]:
        return dict(super().moe_kwargs(config, layer_idx), norm_topk_prob=True)

    def tiny_config(self) -> dict[str, Any]:
        text = {k: v for k, v in TINY_TEXT.items() if k != "intermediate_size"}
        return {"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
                **text, "rope_parameters": dict(ROPE_3_5), "num_experts": 8,
                "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                "shared_expert_intermediate_size": 32, "tie_word_embeddings": False}


def _wrapper(text: dict[str, Any], architecture: str, model_type: str) -> dict[str, Any]:
    text = {k: v for k, v in text.items() if k != "architectures"}
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
              "out_hidden_size": text["hidden_size"], "patch_size": 16, "spatial_merge_size": 2,
              "temporal_patch_size": 2, "in_channels": 3, "num_position_embeddings": 64}
    return {"architectures": [architecture], "model_type": model_type, "text_config": text,
            "vision_config": vision, "vocab_size": text["vocab_size"],
            "max_position_embeddings": text["max_position_embeddings"],
            "tie_word_embeddings": text["tie_word_embeddings"]}


class Qwen3_5VLLoader(Qwen3_5Loader):
    """``Qwen3_5ForConditionalGeneration``: the text model of the VL checkpoint (``text_config``,
    ``model.language_model.*``); the vision tower is skipped."""

    def tiny_config(self) -> dict[str, Any]:
        return _wrapper(super().tiny_config(), "Qwen3_5ForConditionalGeneration", "qwen3_5")


class Qwen3_5MoeVLLoader(Qwen3_5MoeLoader):
    """``Qwen3_5MoeForConditionalGeneration``: the text model of the VL MoE checkpoint."""

    def tiny_config(self) -> dict[str, Any]:
        return _wrapper(super().tiny_config(), "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe")
