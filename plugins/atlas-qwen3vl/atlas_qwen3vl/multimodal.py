"""The image payload of one request, as the engine carries it on its sequences.

The engine reads three things (``Sequence.mm``): :meth:`MultiModalInput.positions` (the
rotary position of each token the model runner feeds), :attr:`~MultiModalInput.position_offset`
(added to the index of every token after the prompt) and :meth:`~MultiModalInput.hash_tokens`
(placeholder ids replaced by the image's content hash, so cached KV blocks are keyed by the
image, not by its placeholder count). The model reads the rest. A parallel engine sends each
step's workers :meth:`~MultiModalInput.for_step` instead of the whole payload.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from atlas_qwen3vl.image_processor import ProcessedImage
from atlas_qwen3vl.mrope import prompt_positions


@dataclass(eq=False)
class MultiModalInput:
    """The images of one prompt and where their placeholder tokens are.

    Attributes:
        images: the preprocessed images, in prompt order.
        offsets: index of each image's first placeholder token in the prompt.
        lengths: placeholder tokens of each image.
        mrope: ``[3, prompt_len]`` int64 3D positions of the prompt.
        position_offset: ``rope_delta``: position of a token after the prompt minus its index.
        encoded: per image, the vision tower's output once computed (rows of that image).
    """

    images: list[ProcessedImage]
    offsets: list[int]
    lengths: list[int]
    mrope: np.ndarray
    position_offset: int
    encoded: list[Any] = field(default_factory=list)

    @classmethod
    def build(cls, prompt: Sequence[int], image_token_id: int, images: list[ProcessedImage],
              merge_size: int) -> "MultiModalInput":
        """Locate each image's run of ``image_token_id`` in the (expanded) ``prompt``.

        Raises:
            ValueError: the runs do not match the images' token counts.
        """
        ids = np.asarray(prompt, np.int64)
        lengths = [img.num_tokens(merge_size) for img in images]
        is_pad = ids == image_token_id
        starts = np.flatnonzero(is_pad & ~np.concatenate([[False], is_pad[:-1]]))
        if len(starts) != len(images) or int(is_pad.sum()) != sum(lengths):
            raise ValueError(f"the prompt has {len(starts)} image placeholder runs "
                             f"({int(is_pad.sum())} tokens) for {len(images)} images "
                             f"({sum(lengths)} tokens)")
        offsets = [int(s) for s in starts]
        grids = [img.grid_thw for img in images]
        mrope, delta = prompt_positions(len(ids), list(zip(offsets, grids)), merge_size)
        return cls(images, offsets, lengths, mrope, delta, [None] * len(images))

    @property
    def num_prompt_tokens(self) -> int:
        return self.mrope.shape[1]

    def positions3d(self, start: int, num: int) -> np.ndarray:
        """``[3, num]`` 3D positions of tokens ``start .. start + num - 1``."""
        n = self.num_prompt_tokens
        out = np.empty((3, num), np.int64)
        inside = max(0, min(num, n - start))
        out[:, :inside] = self.mrope[:, start:start + inside]
        out[:, inside:] = np.arange(start + inside, start + num) + self.position_offset
        return out

    def positions(self, start: int, num: int) -> np.ndarray:
        """``[num]`` 1D rotary positions (exact for text tokens; image tokens get theirs from
        :meth:`positions3d` in the model)."""
        return self.positions3d(start, num)[0]

    def image_spans(self, start: int, num: int) -> list[tuple[int, int, int, int]]:
        """``(image, first row in the image, first token, count)`` of every image token among
        tokens ``start .. start + num - 1``."""
        spans = []
        for i, (offset, length) in enumerate(zip(self.offsets, self.lengths)):
            lo, hi = max(start, offset), min(start + num, offset + length)
            if lo < hi:
                spans.append((i, lo - offset, lo, hi - lo))
        return spans

    def for_step(self, start: int, num: int) -> "MultiModalInput":
        """What a worker of a parallel run needs to feed tokens ``start .. start + num - 1``.

        The payload travels with every step its sequence is in; without this, each decode step
        would re-send every image's pixels. Images those tokens do not touch keep their grid and
        hash but lose their pixels (``pixel_values`` ``None``: the model encodes only images of
        the step's spans), so decode steps and text-only chunks carry none. An image split over
        prefill chunks travels with each of them: the workers keep nothing between steps, so
        nothing of a request outlives it there. ``encoded`` starts empty (a worker encodes
        itself; device arrays are never shipped). ``self`` is left as it is.
        """
        needed = {i for i, _, _, _ in self.image_spans(start, num)}
        images = [img if i in needed else replace(img, pixel_values=None)
                  for i, img in enumerate(self.images)]
        return replace(self, images=images, encoded=[None] * len(images))

    def hash_tokens(self, start: int, tokens: list[int]) -> list[int]:
        """``tokens`` (the ids at ``start ...``) with each image's placeholders replaced by
        values derived from the image's content hash and the placeholder's index."""
        out = list(tokens)
        for i, row, token, count in self.image_spans(start, len(tokens)):
            key = -(int(self.images[i].content_hash[:10], 16) + 1) * (1 << 22)
            for j in range(count):
                out[token - start + j] = key - row - j
        return out
