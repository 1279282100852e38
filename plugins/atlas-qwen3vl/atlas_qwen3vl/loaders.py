"""Weight loaders: ``Qwen3VLForConditionalGeneration`` and ``Qwen3VLMoeForConditionalGeneration``.

The language model is Qwen3 (dense) or Qwen3-MoE (``model.language_model.*``) with interleaved
MRoPE; the vision tower (``model.visual.*``) is :class:`~atlas_qwen3vl.vision.VisionTower`.
Loaders receive either the wrapper ``config.json`` (``text_config`` + ``vision_config``) or the
text config :func:`atlas_core.api.read_config` returns, which keeps ``vision_config`` and the
image token ids of the wrapper.
"""

from __future__ import annotations

from typing import Any

from atlas_core.api import checkpoint_tensors, rope_parameters
from atlas_qwen3.loaders import Qwen3Loader, Qwen3MoeLoader

from atlas_qwen3vl.model import VisionLanguageModel

#: Wrapper fields the language model needs next to its text config.
WRAPPER_FIELDS = ("vision_config", "image_token_id", "video_token_id", "vision_start_token_id",
                  "vision_end_token_id")


def split_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text config with the wrapper fields of :data:`WRAPPER_FIELDS` merged in."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        return config
    merged = {**text, **{k: config[k] for k in WRAPPER_FIELDS if k in config}}
    for key in ("architectures", "torch_dtype", "dtype", "tie_word_embeddings"):
        if key in config:
            merged.setdefault(key, config[key])
    return merged


def mrope_section(config: dict[str, Any]) -> list[int]:
    """The config's ``mrope_section``: rotary frequencies per t/h/w axis."""
    section = list(rope_parameters(config).get("mrope_section") or [24, 20, 20])
    if len(section) != 3 or any(not isinstance(n, int) or n < 0 for n in section):
        raise ValueError(f"config.json rope 'mrope_section' {section} must be three counts")
    return section


class VisionLoaderMixin:
    """Builds the text stack of the parent loader inside a :class:`VisionLanguageModel`."""

    def resolve_config(self, config: dict[str, Any]) -> dict[str, Any]:
        return super().resolve_config(split_config(config))

    def validate_config(self, config: dict[str, Any]) -> None:
        super().validate_config(config)
        config = self.resolve_config(config)
        vision = config.get("vision_config")
        if not isinstance(vision, dict):
            raise ValueError("config.json has no 'vision_config'; a vision-language checkpoint "
                             "needs one (or serve the text model with its CausalLM architecture)")
        for name in ("hidden_size", "depth", "num_heads", "intermediate_size",
                     "out_hidden_size", "num_position_embeddings"):
            if not isinstance(vision.get(name), int) or vision[name] <= 0:
                raise ValueError(f"config.json vision_config.{name} must be a positive integer, "
                                 f"got {vision.get(name)!r}")
        if vision["out_hidden_size"] != config["hidden_size"]:
            raise ValueError(f"vision_config.out_hidden_size ({vision['out_hidden_size']}) must "
                             f"equal the text hidden_size ({config['hidden_size']})")

    def build(self, config: dict[str, Any]) -> VisionLanguageModel:
        config = self.resolve_config(config)
        self.validate_config(config)
        layers = [self.build_layer(config, i) for i in range(config["num_hidden_layers"])]
        return VisionLanguageModel(
            config, layers, vision_config=config["vision_config"],
            image_token_id=config.get("image_token_id", 151655),
            mrope_section=mrope_section(config), hidden_size=config["hidden_size"],
            vocab_size=config["vocab_size"], rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            max_position_embeddings=self.max_position_embeddings(config),
            zero_centered_norm=self.zero_centered_norm)

    def checkpoint_tensors(self, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        shapes = checkpoint_tensors(self.build(config))
        return {("model.language_model." + n[len("model."):]
                 if n.startswith("model.") and not n.startswith("model.visual.") else n): s
                for n, s in shapes.items()}


TINY_VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
               "out_hidden_size": 64, "patch_size": 8, "spatial_merge_size": 2,
               "temporal_patch_size": 2, "in_channels": 3, "num_position_embeddings": 16,
               "hidden_act": "gelu_pytorch_tanh", "deepstack_visual_indexes": [0, 1]}


def tiny_wrapper(text: dict[str, Any], architecture: str, model_type: str) -> dict[str, Any]:
    """A tiny VL ``config.json`` around ``text`` with token ids inside a 384-token vocabulary."""
    text = {k: v for k, v in text.items() if k != "architectures"}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0,
                               "mrope_section": [4, 2, 2], "mrope_interleaved": True}
    text.pop("rope_theta", None)
    return {"architectures": [architecture], "model_type": model_type, "text_config": text,
            "vision_config": dict(TINY_VISION), "image_token_id": 370, "video_token_id": 371,
            "vision_start_token_id": 368, "vision_end_token_id": 369,
            "tie_word_embeddings": text.get("tie_word_embeddings", False)}


class Qwen3VLLoader(VisionLoaderMixin, Qwen3Loader):
    """``Qwen3VLForConditionalGeneration``: Qwen3 text model + vision tower with DeepStack."""

    def tiny_config(self) -> dict[str, Any]:
        text = {**super().tiny_config(), "model_type": "qwen3_vl_text"}
        return tiny_wrapper(text, "Qwen3VLForConditionalGeneration", "qwen3_vl")


class Qwen3VLMoeLoader(VisionLoaderMixin, Qwen3MoeLoader):
    """``Qwen3VLMoeForConditionalGeneration``: Qwen3-MoE text model (fused experts,
    renormalised top-k) + vision tower with DeepStack."""

    def moe_kwargs(self, config: dict[str, Any], layer_idx: int) -> dict[str, Any]:
        return dict(super().moe_kwargs(config, layer_idx), norm_topk_prob=True)

    def tiny_config(self) -> dict[str, Any]:
        text = {**super().tiny_config(), "model_type": "qwen3_vl_moe_text", "mlp_only_layers": []}
        return tiny_wrapper(text, "Qwen3VLMoeForConditionalGeneration", "qwen3_vl_moe")
