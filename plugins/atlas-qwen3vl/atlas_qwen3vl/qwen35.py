"""The vision-language checkpoints of Qwen3.5 / Qwen3.6 (``Qwen3_5ForConditionalGeneration``,
``Qwen3_5MoeForConditionalGeneration``): atlas-qwen35's hybrid text stack (Gated DeltaNet +
gated attention, partial interleaved MRoPE) around the Qwen3-VL vision tower without DeepStack.
atlas-qwen35 registers these loaders for the two architectures when this plugin is installed."""

from __future__ import annotations

from typing import Any

from atlas_qwen35.loaders import Qwen3_5MoeVLLoader, Qwen3_5VLLoader

from atlas_qwen3vl.loaders import VisionLoaderMixin

#: Qwen3.5's vision tower as a tiny test config (no DeepStack).
TINY_VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
               "patch_size": 8, "spatial_merge_size": 2, "temporal_patch_size": 2,
               "in_channels": 3, "num_position_embeddings": 16,
               "hidden_act": "gelu_pytorch_tanh", "deepstack_visual_indexes": []}


def _tiny(config: dict[str, Any]) -> dict[str, Any]:
    vision = {**TINY_VISION, "out_hidden_size": config["text_config"]["hidden_size"]}
    return {**config, "vision_config": vision, "image_token_id": 383, "video_token_id": 380,
            "vision_start_token_id": 381, "vision_end_token_id": 382}


class Qwen3_5VisionLoader(VisionLoaderMixin, Qwen3_5VLLoader):
    """``Qwen3_5ForConditionalGeneration`` with its vision tower."""

    skipped_prefixes = (("mtp.", "multi-token-prediction (MTP) head"),)

    def tiny_config(self) -> dict[str, Any]:
        return _tiny(super().tiny_config())


class Qwen3_5MoeVisionLoader(VisionLoaderMixin, Qwen3_5MoeVLLoader):
    """``Qwen3_5MoeForConditionalGeneration`` (Qwen3.5 / Qwen3.6 MoE) with its vision tower."""

    skipped_prefixes = (("mtp.", "multi-token-prediction (MTP) head"),)

    def tiny_config(self) -> dict[str, Any]:
        return _tiny(super().tiny_config())
