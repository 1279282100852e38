"""Vision timings of ``atlas bench`` on a vision-language model: the time to encode one image
(preprocessing on the host, the vision tower on the device) and the time to first token of an
image + text prompt through the engine.

A model takes images when it offers ``mm_processor`` (``image_processor`` for preprocessing,
``process(prompt_ids, images)``) and ``encode_images(pixel_values, grids)``, as
atlas-qwen3vl's models do; others are skipped.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

#: Text tokens after the image in the TTFT prompt.
PROMPT_TEXT_TOKENS = 100


@dataclass
class VisionBench:
    """Medians over the timed repeats (the first, warm-up run is not counted).

    Attributes:
        image_size: side of the square test image in pixels.
        image_tokens: placeholder tokens the image takes in the prompt.
        preprocess_ms: decode + resize + normalise + patchify on the host.
        encode_ms: the vision tower on the device (synchronised).
        ttft_ms: first token of an image + :data:`PROMPT_TEXT_TOKENS`-token prompt.
    """

    image_size: int
    image_tokens: int
    preprocess_ms: float
    encode_ms: float
    ttft_ms: float

    def to_text(self) -> str:
        return (f"vision: {self.image_size}x{self.image_size} image = {self.image_tokens} tokens; "
                f"preprocess {self.preprocess_ms:.1f} ms, encode {self.encode_ms:.1f} ms, "
                f"TTFT (image + {PROMPT_TEXT_TOKENS} tokens) {self.ttft_ms:.1f} ms")


def takes_images(model: Any) -> bool:
    """Whether ``model`` has a vision tower the bench can time."""
    return hasattr(model, "encode_images") and getattr(model, "mm_processor", None) is not None


def image_prompt_len(config: dict[str, Any], image_size: int) -> int:
    """Tokens of the TTFT prompt for a square image (0 when ``config`` has no vision tower); an
    image smaller than Qwen3-VL's default ``min_pixels`` (256 x 256) is counted at that size."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return 0
    factor = int(vision.get("patch_size", 16)) * int(vision.get("spatial_merge_size", 2))
    side = -(-max(image_size, 256) // factor)
    return side * side + PROMPT_TEXT_TOKENS + 2


def _png(size: int, seed: int) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def _first_token_ms(engine: Any, rid: str, ids: list[int], mm: Any) -> float:
    from atlas_core.engine import SamplingParams

    start = time.perf_counter()
    engine.add_request(rid, ids, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True),
                       mm_inputs=mm)
    while engine.has_unfinished_requests():
        if any(out.outputs[0].token_ids for out in engine.step()):
            break
    elapsed = (time.perf_counter() - start) * 1e3
    while engine.has_unfinished_requests():
        engine.step()
    return elapsed


def measure_vision(engine: Any, image_size: int = 1024, repeats: int = 3,
                   log: Callable[[str], None] | None = None) -> VisionBench:
    """Time :class:`VisionBench`'s numbers on ``engine`` (an ``LLMEngine`` whose model takes
    images, see :func:`takes_images`)."""
    model, backend = engine.model, engine.backend
    processor = model.mm_processor
    image_token = processor.image_token_id
    pre, enc, ttft, tokens = [], [], [], 0
    rng = np.random.default_rng(0)
    for i in range(repeats + 1):
        data = _png(image_size, i)
        start = time.perf_counter()
        image = processor.image_processor.preprocess(processor.image_processor.decode(data))
        mid = time.perf_counter()
        model.encode_images([image.pixel_values], [image.grid_thw])
        backend.synchronize()
        end = time.perf_counter()
        text = rng.integers(0, min(image_token, model.vocab_size) - 8, PROMPT_TEXT_TOKENS).tolist()
        ids, mm = processor.process([image_token] + text, [data])
        tokens = ids.count(image_token)
        first = _first_token_ms(engine, f"vision-bench-{i}", ids, mm)
        if i:
            pre.append((mid - start) * 1e3)
            enc.append((end - mid) * 1e3)
            ttft.append(first)
        if log is not None:
            log(f"vision run {i}: encode {(end - mid) * 1e3:.1f} ms, TTFT {first:.1f} ms")
    return VisionBench(image_size, tokens, float(np.median(pre)), float(np.median(enc)),
                       float(np.median(ttft)))
