"""The server-facing multimodal processor of a vision-language model: image bytes + the rendered
prompt -> the prompt with each image placeholder expanded + the engine payload."""

from __future__ import annotations

from typing import Sequence

from atlas_qwen3vl.image_processor import ImageError, ImageProcessor
from atlas_qwen3vl.multimodal import MultiModalInput


class ImageInputError(ValueError):
    """One image of a request cannot be used; ``image_index`` says which (0-based)."""

    def __init__(self, image_index: int, message: str) -> None:
        super().__init__(message)
        self.image_index = image_index


class Qwen3VLProcessor:
    """Expands ``<|image_pad|>`` as the HF ``Qwen3VLProcessor`` does: the chat template renders
    one placeholder per image, which becomes ``grid_t * grid_h * grid_w / merge**2`` copies.

    Args:
        image_processor: resizing and patching (:class:`ImageProcessor`).
        image_token_id: the placeholder token.
    """

    def __init__(self, image_processor: ImageProcessor, image_token_id: int) -> None:
        self.image_processor = image_processor
        self.image_token_id = image_token_id

    def process(self, prompt_ids: Sequence[int],
                images: Sequence[bytes]) -> tuple[list[int], MultiModalInput]:
        """Decode, preprocess and place ``images`` (encoded bytes, in prompt order).

        Raises:
            ImageInputError: an image is undecodable or of an unusable shape.
            ValueError: the prompt's placeholders do not match the images.
        """
        processed = []
        for i, data in enumerate(images):
            try:
                processed.append(self.image_processor.preprocess(self.image_processor.decode(data)))
            except ImageError as exc:
                raise ImageInputError(i, f"image {i + 1}: {exc}") from None
        places = [i for i, t in enumerate(prompt_ids) if t == self.image_token_id]
        if len(places) != len(processed):
            raise ValueError(f"the chat template rendered {len(places)} image placeholders for "
                             f"{len(processed)} images (does this model's template take images?)")
        merge = self.image_processor.merge_size
        expanded, last = [], 0
        for place, image in zip(places, processed):
            expanded += list(prompt_ids[last:place])
            expanded += [self.image_token_id] * image.num_tokens(merge)
            last = place + 1
        expanded += list(prompt_ids[last:])
        mm = MultiModalInput.build(expanded, self.image_token_id, processed, merge)
        return expanded, mm
