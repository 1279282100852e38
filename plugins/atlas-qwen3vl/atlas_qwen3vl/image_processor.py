"""Image preprocessing as the HF Qwen2-VL / Qwen3-VL image processor (PIL backend) does it.

Decode -> RGB -> resize (bicubic) so both sides are multiples of ``patch_size * merge_size`` and
the area lies within ``[min_pixels, max_pixels]`` -> scale to ``[0, 1]`` -> normalise ->
cut into ``temporal_patch_size x patch_size x patch_size`` patches (a still image repeats its one
frame over the temporal patch), ordered by ``merge_size x merge_size`` blocks.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Qwen3-VL's ``preprocessor_config.json`` values, used when a checkpoint has none.
DEFAULTS = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "min_pixels": 65536, "max_pixels": 16777216}
#: Decoded images larger than this many pixels are refused before resizing (decompression bombs).
MAX_DECODED_PIXELS = 64 * 1024 * 1024


class ImageError(ValueError):
    """An image that cannot be used: undecodable, too large, or of an impossible shape."""


@dataclass(eq=False)
class ProcessedImage:
    """One preprocessed image.

    Attributes:
        pixel_values: ``[grid_t * grid_h * grid_w, channels * temporal * patch * patch]`` float32
            (``None`` in a parallel step's copy for a step that does not feed the image, see
            :meth:`~atlas_qwen3vl.multimodal.MultiModalInput.for_step`).
        grid_thw: ``(grid_t, grid_h, grid_w)`` in patches.
        content_hash: SHA-256 hex digest of the pixels (the prefix-cache key of the image).
    """

    pixel_values: np.ndarray | None
    grid_thw: tuple[int, int, int]
    content_hash: str

    def num_tokens(self, merge_size: int) -> int:
        """Placeholder tokens this image takes in the prompt."""
        t, h, w = self.grid_thw
        return t * h * w // (merge_size * merge_size)


def smart_resize(height: int, width: int, factor: int, min_pixels: int,
                 max_pixels: int) -> tuple[int, int]:
    """The ``(height, width)`` the HF processor resizes to: multiples of ``factor``, area within
    ``[min_pixels, max_pixels]``, aspect ratio kept as closely as possible."""
    if max(height, width) / min(height, width) > 200:
        raise ImageError(f"image aspect ratio must be below 200, got {height}x{width}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


class ImageProcessor:
    """Turns encoded images (PNG, JPEG, WebP, GIF… bytes) into patches for the vision tower.

    Args:
        config: preprocessing fields (see :data:`DEFAULTS`); ``size.shortest_edge`` /
            ``size.longest_edge`` are read as min / max pixels, as HF does.
    """

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        cfg = {**DEFAULTS, **(config or {})}
        size = cfg.get("size") or {}
        self.min_pixels = int(size.get("shortest_edge", cfg["min_pixels"]))
        self.max_pixels = int(size.get("longest_edge", cfg["max_pixels"]))
        self.patch_size = int(cfg["patch_size"])
        self.temporal_patch_size = int(cfg["temporal_patch_size"])
        self.merge_size = int(cfg["merge_size"])
        self.mean = np.asarray(cfg["image_mean"], np.float32)[:, None, None]
        self.std = np.asarray(cfg["image_std"], np.float32)[:, None, None]

    @classmethod
    def from_pretrained(cls, path: str | Path, vision_config: dict[str, Any]) -> "ImageProcessor":
        """The processor of a model directory: ``preprocessor_config.json`` when present,
        completed by the checkpoint's ``vision_config`` (patch, temporal and merge sizes)."""
        config = {"patch_size": vision_config.get("patch_size", DEFAULTS["patch_size"]),
                  "temporal_patch_size": vision_config.get("temporal_patch_size", 2),
                  "merge_size": vision_config.get("spatial_merge_size", 2)}
        file = Path(path) / "preprocessor_config.json"
        if file.is_file():
            config.update(json.loads(file.read_text()))
        return cls(config)

    def decode(self, data: bytes) -> Any:
        """Decode encoded image bytes into an RGB PIL image.

        Raises:
            ImageError: not an image Pillow can read, or more than :data:`MAX_DECODED_PIXELS`.
        """
        from PIL import Image, UnidentifiedImageError

        try:
            image = Image.open(io.BytesIO(data))
            if image.width * image.height > MAX_DECODED_PIXELS:
                raise ImageError(f"image is {image.width}x{image.height}, more than "
                                 f"{MAX_DECODED_PIXELS} pixels; send a smaller image")
            image.load()
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
            if isinstance(exc, ImageError):
                raise
            raise ImageError(f"cannot decode the image ({type(exc).__name__}: {exc}); send a "
                             "PNG, JPEG, WebP or GIF") from None
        return image.convert("RGB")

    def preprocess(self, image: Any) -> ProcessedImage:
        """Resize, normalise and patchify one RGB PIL image."""
        from PIL import Image

        factor = self.patch_size * self.merge_size
        height, width = smart_resize(image.height, image.width, factor, self.min_pixels,
                                     self.max_pixels)
        resized = np.asarray(image.resize((width, height), resample=Image.BICUBIC))
        # pixels: [channels, height, width]
        pixels = (resized.transpose(2, 0, 1).astype(np.float64) * (1 / 255)).astype(np.float32)
        pixels = (pixels - self.mean) / self.std
        patches, grid_h, grid_w = self._patchify(pixels)
        digest = hashlib.sha256(np.ascontiguousarray(resized).tobytes())
        digest.update(f"{height}x{width}".encode())
        return ProcessedImage(patches, (1, grid_h, grid_w), digest.hexdigest())

    def _patchify(self, pixels: np.ndarray) -> tuple[np.ndarray, int, int]:
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        channels, height, width = pixels.shape
        grid_h, grid_w = height // p, width // p
        blocks = pixels.reshape(channels, grid_h // m, m, p, grid_w // m, m, p)
        blocks = blocks.transpose(1, 4, 2, 5, 0, 3, 6)
        blocks = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], t, p, p))
        return (np.ascontiguousarray(blocks).reshape(grid_h * grid_w, channels * t * p * p),
                grid_h, grid_w)
