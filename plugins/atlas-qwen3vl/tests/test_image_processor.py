"""Preprocessing and placeholder expansion against the HF image processor (PIL backend) and the
HF Qwen3-VL processor, and clear errors for bad images."""

import numpy as np
import pytest

from atlas_core.api import Tokenizer
from atlas_qwen3vl.image_processor import ImageError, ImageProcessor, smart_resize
from atlas_qwen3vl.processor import Qwen3VLProcessor
from qwen3vl_checkpoints import png_bytes, write_vl_tokenizer

transformers = pytest.importorskip("transformers")
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (  # noqa: E402
    Qwen2VLImageProcessorPil, smart_resize as hf_smart_resize)

CONFIG = {"patch_size": 8, "merge_size": 2, "temporal_patch_size": 2,
          "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
          "size": {"shortest_edge": 1024, "longest_edge": 64 * 64}}


def _hf_processor():
    return Qwen2VLImageProcessorPil(**CONFIG)


@pytest.mark.parametrize("hw", [(40, 56), (1000, 30), (7, 9), (4000, 3000), (333, 333)])
def test_smart_resize_matches_hf(hw):
    args = (32, 56 * 56, 28 * 28 * 1280)
    assert smart_resize(*hw, *args) == hf_smart_resize(*hw, *args)


def test_smart_resize_refuses_extreme_aspect():
    with pytest.raises(ImageError, match="aspect ratio"):
        smart_resize(10, 2500, 32, 1024, 4096)


@pytest.mark.parametrize("hw", [(40, 56), (120, 90), (16, 16)])
def test_pixels_and_grid_match_hf(hw):
    from PIL import Image

    ours = ImageProcessor(CONFIG)
    image = ours.decode(png_bytes(*hw, seed=hw[0]))
    mine = ours.preprocess(image)
    ref = _hf_processor()(images=[Image.open(__import__("io").BytesIO(png_bytes(*hw, seed=hw[0])))])
    assert list(mine.grid_thw) == ref["image_grid_thw"][0].tolist()
    assert np.abs(mine.pixel_values - np.asarray(ref["pixel_values"])).max() < 1e-5


def test_content_hash_follows_pixels():
    ours = ImageProcessor(CONFIG)
    a = ours.preprocess(ours.decode(png_bytes(40, 56, 1)))
    b = ours.preprocess(ours.decode(png_bytes(40, 56, 1)))
    c = ours.preprocess(ours.decode(png_bytes(40, 56, 2)))
    assert a.content_hash == b.content_hash != c.content_hash


@pytest.mark.parametrize("data, match", [(b"not an image", "cannot decode"),
                                         (png_bytes(8, 8)[:40], "cannot decode")])
def test_undecodable_images(data, match):
    with pytest.raises(ImageError, match=match):
        ImageProcessor(CONFIG).decode(data)


def test_placeholders_expand_as_hf_processor(tmp_path):
    from PIL import Image
    import io

    ids = write_vl_tokenizer(tmp_path)
    tok = Tokenizer.from_dir(tmp_path)
    images = [png_bytes(40, 56, 3), png_bytes(30, 70, 4)]
    parts = [{"type": "text", "text": "Compare "}, {"type": "image"},
             {"type": "text", "text": " and "},
             {"type": "image"}, {"type": "text", "text": "."}]
    messages = [{"role": "user", "content": parts}]
    prompt = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
    processor = Qwen3VLProcessor(ImageProcessor(CONFIG), ids["<|image_pad|>"])
    expanded, mm = processor.process(prompt, images)

    # the HF Qwen3VLProcessor's expansion (its constructor needs torchvision for videos): each
    # <|image_pad|> of the rendered text becomes grid_t * grid_h * grid_w / merge**2 copies
    hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(tmp_path)
    text = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    grids = _hf_processor()(images=[Image.open(io.BytesIO(b)) for b in images])["image_grid_thw"]
    for grid in grids:
        text = text.replace("<|image_pad|>", "<|placeholder|>" * (int(np.prod(grid)) // 4), 1)
    ref = {"input_ids": [hf_tok(text.replace("<|placeholder|>", "<|image_pad|>"))["input_ids"]]}
    assert expanded == ref["input_ids"][0]
    assert mm.offsets[0] < mm.offsets[1] and sum(mm.lengths) == expanded.count(ids["<|image_pad|>"])


def test_placeholder_count_must_match_images(tmp_path):
    processor = Qwen3VLProcessor(ImageProcessor(CONFIG), 383)
    with pytest.raises(ValueError, match="1 image placeholders for 2 images"):
        processor.process([1, 383, 2], [png_bytes(16, 16), png_bytes(16, 16, 1)])
    with pytest.raises(ValueError, match="image 2: cannot decode"):
        processor.process([1, 383, 383, 2], [png_bytes(16, 16), b"junk"])
