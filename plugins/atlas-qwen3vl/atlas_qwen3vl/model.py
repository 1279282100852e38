"""A causal LM with a vision tower: image embeddings in place of placeholder tokens, DeepStack
features added after the first decoder layers, 3D MRoPE positions for image tokens.

The model runner hands the model, for a step that feeds image placeholder tokens, the list
``meta.multimodal`` of ``(first row in the step, first token, token count, MultiModalInput)``
per prefill chunk of a sequence carrying images. Text tokens already have their 1D position
(``MultiModalInput.positions``); an image token's rotary rows are composed from its 3D position
into spare rows past ``max_position_embeddings`` of one rotary table all attention layers share,
and the token is pointed at its row, so the attention ops run unchanged.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from atlas_core.api import Attention, CausalLM, StepMetadata, rope_cos_sin_cache, rope_inv_freq

from atlas_qwen3vl.image_processor import ImageProcessor
from atlas_qwen3vl.mrope import mrope_cos_sin
from atlas_qwen3vl.processor import Qwen3VLProcessor
from atlas_qwen3vl.vision import VisionOutput, VisionTower

#: Image tokens one step may carry (spare rotary rows); a longer prefill chunk is refused.
MAX_IMAGE_TOKENS_PER_STEP = 16384


class VisionLanguageModel(CausalLM):
    """:class:`~atlas_core.api.CausalLM` plus ``model.visual`` (:class:`VisionTower`).

    Args:
        config, layers, **kwargs: as :class:`~atlas_core.api.CausalLM` (text model).
        vision_config: the checkpoint's ``vision_config``.
        image_token_id: the placeholder token of image embeddings.
        mrope_section: rotary frequencies per axis (t, h, w).
    """

    def __init__(self, config: dict[str, Any], layers: list, *, vision_config: dict[str, Any],
                 image_token_id: int, mrope_section: list[int], **kwargs: Any) -> None:
        super().__init__(config, layers, **kwargs)
        self.visual = self.add("model.visual", VisionTower(vision_config))
        self.vision_config = vision_config
        self.image_token_id = int(image_token_id)
        self.merge_size = self.visual.merge
        self.mrope_section = list(mrope_section)
        self.rope_table: Any = None
        self._mm_processor: Qwen3VLProcessor | None = None
        self.inv_freq: np.ndarray | None = None

    @property
    def mm_processor(self) -> Qwen3VLProcessor:
        """The request-side processor (the model directory's ``preprocessor_config.json`` when
        it has one, else Qwen3-VL's defaults with this tower's patch sizes)."""
        if self._mm_processor is None:
            path = getattr(self, "path", None)
            images = (ImageProcessor.from_pretrained(path, self.vision_config) if path
                      else ImageProcessor({"patch_size": self.visual.patch_size,
                                           "temporal_patch_size": self.visual.temporal,
                                           "merge_size": self.merge_size}))
            self._mm_processor = Qwen3VLProcessor(images, self.image_token_id)
        return self._mm_processor

    def setup(self) -> None:
        attention = [m for m in self.modules() if isinstance(m, Attention)]
        if not attention:
            return
        first = attention[0]
        if sum(self.mrope_section) != first.rotary_dim // 2:
            raise ValueError(f"config.json rope 'mrope_section' {self.mrope_section} must sum to "
                             f"the rotary frequencies per head ({first.rotary_dim // 2})")
        base = rope_cos_sin_cache(first.rotary_dim, first.max_position_embeddings, first.rope,
                                  first.max_position_embeddings)
        spare = np.zeros((MAX_IMAGE_TOKENS_PER_STEP, base.shape[1]), np.float32)
        self.rope_table = self.backend.from_host(np.concatenate([base, spare]))
        self.inv_freq = rope_inv_freq(first.rotary_dim, first.rope,
                                      first.max_position_embeddings)[0]
        for layer in attention:
            layer.cos_sin_cache = self.rope_table

    def encode_images(self, pixel_values: list[np.ndarray], grids: list) -> list[VisionOutput]:
        """Run the vision tower over a batch of images; one :class:`VisionOutput` per image in
        memory of its own (it outlives the step's workspace)."""
        out = self.visual.forward(pixel_values, grids)
        per_image, row = [], 0
        for grid in grids:
            n = int(np.prod(grid)) // (self.merge_size ** 2)
            per_image.append(VisionOutput(self.visual.persist(out.embeds[row:row + n]),
                                          [a[row:row + n] for a in out.deepstack]))
            row += n
        return per_image

    def _encode_pending(self, chunks: list) -> None:
        pending: dict[tuple[int, int], tuple] = {}
        for _, start, num, mm in chunks:
            for i, _, _, _ in mm.image_spans(start, num):
                if mm.encoded[i] is None:
                    pending[id(mm), i] = (mm, i)
        pending = list(pending.values())
        if pending:
            outs = self.encode_images([mm.images[i].pixel_values for mm, i in pending],
                                      [mm.images[i].grid_thw for mm, i in pending])
            for (mm, i), out in zip(pending, outs):
                mm.encoded[i] = out

    def _spans(self, chunks: list) -> list[tuple[int, VisionOutput, int, int]]:
        # (step row, image output, first image row, count) of every image run in the step
        spans = []
        for row0, start, num, mm in chunks:
            for i, first, token, count in mm.image_spans(start, num):
                spans.append((row0 + token - start, mm.encoded[i], first, count))
        return spans

    def _positions(self, chunks: list, meta: StepMetadata) -> Any:
        positions = np.array(meta.host["positions"][:meta.num_tokens], np.int32)
        rows, coords = [], []
        for row0, start, num, mm in chunks:
            pos3 = mm.positions3d(start, num)
            for _, _, token, count in mm.image_spans(start, num):
                rows.extend(range(row0 + token - start, row0 + token - start + count))
                coords.append(pos3[:, token - start:token - start + count])
        if len(rows) > MAX_IMAGE_TOKENS_PER_STEP:
            raise ValueError(f"a step carries {len(rows)} image tokens, more than "
                             f"{MAX_IMAGE_TOKENS_PER_STEP}; lower --max-prefill-tokens")
        if rows:
            table = mrope_cos_sin(np.concatenate(coords, axis=1), self.inv_freq,
                                  self.mrope_section)
            first = self.max_position_embeddings
            self.backend.copy_from_host(self.rope_table[first:first + len(rows)], table)
            positions[rows] = first + np.arange(len(rows))
        return self.backend.from_host(positions)

    def forward(self, input_ids: Any, meta: StepMetadata) -> Any:
        chunks = meta.multimodal
        if not chunks:
            return super().forward(input_ids, meta)
        ops = self.ops
        self._encode_pending(chunks)
        spans = self._spans(chunks)
        hidden = ops.embedding(input_ids, self.params["model.embed_tokens.weight"])
        for row, out, first, count in spans:
            self.backend.copy_(hidden[row:row + count], out.embeds[first:first + count])
        meta = replace(meta, positions=self._positions(chunks, meta))
        residual = None
        scope = self.backend.layer_scope(2 * hidden.nbytes)
        num_deepstack = min((len(out.deepstack) for _, out, _, _ in spans), default=0)
        for i, layer in enumerate(self.layers):
            hidden, residual = layer.forward(hidden, residual, meta)
            if scope is not None:
                hidden, residual = scope.carry(hidden, residual)
            if i < num_deepstack:
                target = residual if residual is not None else hidden
                for row, out, first, count in spans:
                    added = ops.add(target[row:row + count], out.deepstack[i][first:first + count])
                    self.backend.copy_(target[row:row + count], added)
        norm = self.params["model.norm.weight"]
        if residual is None:
            return ops.rms_norm(hidden, norm, self.eps, zero_centered=self.zero_centered_norm)
        hidden, _ = ops.rms_norm(hidden, norm, self.eps, residual,
                                 zero_centered=self.zero_centered_norm)
        return hidden
