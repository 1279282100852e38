"""Weight loader of ``Mistral3ForConditionalGeneration``: the text model of Mistral's multimodal
checkpoints (``text_config``, ``model.language_model.*``; the vision tower and projector are
skipped). A ``mistral4`` text model is built as :class:`~atlas_mistral.loader.Mistral4Loader`
builds it; a ``mistral`` one (Mistral-Small-3.x) from core's dense layers (GQA ``attention``
and ``mlp``), as ``MistralForCausalLM``."""

from __future__ import annotations

from typing import Any

from atlas_core.api import DecoderOnlyLoader, rope_parameters

from atlas_mistral.loader import Mistral4Loader

#: Text models of the dense (GQA) kind; their absent fields take ``MistralConfig``'s defaults.
DENSE_TYPES = ("mistral", "ministral", "ministral3")
DENSE_DEFAULTS = {**DecoderOnlyLoader.config_defaults, "max_position_embeddings": 131072,
                  "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False}


class DenseMistralText(DecoderOnlyLoader):
    """The dense (Llama-stack) text model of a Mistral-3 checkpoint, with its defaults."""

    config_defaults = DENSE_DEFAULTS


_DENSE = DenseMistralText()


def is_dense(config: dict[str, Any]) -> bool:
    """Whether the text model is a dense GQA decoder (no ``kv_lora_rank``)."""
    return config.get("model_type") in DENSE_TYPES and "kv_lora_rank" not in config


class Mistral3Loader(Mistral4Loader):
    """``Mistral3ForConditionalGeneration`` (text model only), MLA or dense by ``model_type``."""

    architecture = "Mistral3ForConditionalGeneration"

    def resolve_config(self, config: dict[str, Any]) -> dict[str, Any]:
        return _DENSE.resolve_config(config) if is_dense(config) else super().resolve_config(config)

    def validate_config(self, config: dict[str, Any]) -> None:
        if not is_dense(config):
            super().validate_config(config)
            return
        DecoderOnlyLoader.validate_config(self, config)
        if rope_parameters(config).get("llama_4_scaling_beta"):
            raise ValueError(
                "config.json 'llama_4_scaling_beta' (Ministral-3 query scaling by position) is "
                "not supported for dense Mistral3ForConditionalGeneration text models yet; "
                "Mistral-Small-3.x checkpoints (no scaling) and mistral4 text models load")
        window = config.get("sliding_window")
        if window and window < self.max_position_embeddings(config):
            raise ValueError(f"config.json 'sliding_window' ({window}) is not supported for "
                             "Mistral3ForConditionalGeneration; set it to null")

    def attention_kwargs(self, config: dict[str, Any], layer_idx: int) -> dict[str, Any]:
        if is_dense(config):
            return DecoderOnlyLoader.attention_kwargs(self, config, layer_idx)
        return super().attention_kwargs(config, layer_idx)

    def build_layer(self, config: dict[str, Any], layer_idx: int) -> Any:
        if is_dense(config):
            return DecoderOnlyLoader.build_layer(self, config, layer_idx)
        return super().build_layer(config, layer_idx)

    def is_sparse(self, config: dict[str, Any], layer_idx: int) -> bool:
        return not is_dense(config) and super().is_sparse(config, layer_idx)

    def checkpoint_tensors(self, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The text model's tensors (a wrapper config is read through its ``text_config``)."""
        text = config.get("text_config")
        if isinstance(text, dict):
            config = {**text, "architectures": config.get("architectures")}
        return super().checkpoint_tensors(config)

    def tiny_config(self) -> dict[str, Any]:
        text = {k: v for k, v in super().tiny_config().items() if k != "architectures"}
        vision = {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64,
                  "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 16,
                  "image_size": 64, "patch_size": 16, "num_channels": 3, "rope_theta": 10000.0}
        return {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
                "text_config": text, "vision_config": vision, "image_token_index": 10,
                "spatial_merge_size": 2, "multimodal_projector_bias": False,
                "projector_hidden_act": "gelu", "vision_feature_layer": -1,
                "tie_word_embeddings": False, "vocab_size": text["vocab_size"],
                "max_position_embeddings": text["max_position_embeddings"]}
