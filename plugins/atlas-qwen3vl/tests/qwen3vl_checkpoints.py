"""Tiny Qwen3-VL checkpoints saved by HF transformers, with a tokenizer that has the vision
tokens and a Qwen-VL style chat template (an image renders as
``<|vision_start|><|image_pad|><|vision_end|>``)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from atlas_core.testing.tiny_tokenizer import ADDED_TOKENS, SPECIAL_TOKENS, build_tokenizer

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")

VL_TEMPLATE = """\
{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\\n' }}
{%- if message.content is string %}{{- message.content }}
{%- else %}{%- for item in message.content %}
{%- if 'image' in item or 'image_url' in item or item.type == 'image' %}\
{{- '<|vision_start|><|image_pad|><|vision_end|>' }}
{%- elif 'text' in item %}{{- item.text }}{%- endif %}
{%- endfor %}{%- endif %}
{{- '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def write_vl_tokenizer(path: Path, vocab_size: int = 384) -> dict[str, int]:
    """The tiny byte-level BPE of ``vocab_size - 3`` tokens plus the three vision tokens."""
    from tokenizers import AddedToken

    tok = build_tokenizer(vocab_size - len(VISION_TOKENS))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    tok.save(str(path / "tokenizer.json"))
    names = SPECIAL_TOKENS + ADDED_TOKENS + VISION_TOKENS
    ids = {t: tok.token_to_id(t) for t in names}
    added = {str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": t not in ADDED_TOKENS}
             for t in names}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False,
              "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "unk_token": None, "model_max_length": 4096, "added_tokens_decoder": added,
              "chat_template": VL_TEMPLATE, "clean_up_tokenization_spaces": False}
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return ids


def save_hf_checkpoint(architecture: str, path: Path, registry, dtype: str = "float32",
                       seed: int = 0) -> Path:
    """Build the loader's tiny config in HF transformers, draw O(1)-activation random weights,
    ``save_pretrained`` it, and add the VL tokenizer."""
    import torch
    import transformers

    config = registry.create("weight_loaders", architecture, registry=registry).tiny_config()
    path.mkdir(parents=True, exist_ok=True)
    ids = write_vl_tokenizer(path)
    config.update(image_token_id=ids["<|image_pad|>"],
                  vision_start_token_id=ids["<|vision_start|>"],
                  vision_end_token_id=ids["<|vision_end|>"], video_token_id=ids["<think>"])
    config["text_config"].update(eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    cls = getattr(transformers, architecture)
    hf_config = cls.config_class(**config)
    torch.manual_seed(seed)
    model = cls(hf_config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "norm1" in name or "norm2" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p) if name.endswith("weight")
                        else 0.1 * torch.randn_like(p))
            elif p.dim() > 1:
                p.normal_(0.0, 1.0 / np.sqrt(p[0].numel() if p.dim() > 3 else p.shape[-1]))
            else:
                p.normal_(0.0, 0.1)
    model.to(getattr(torch, dtype)).save_pretrained(path)
    generation = {"eos_token_id": [ids["<|im_end|>"]], "pad_token_id": ids["<|endoftext|>"],
                  "do_sample": False}
    (path / "generation_config.json").write_text(json.dumps(generation))
    return path


def png_bytes(height: int, width: int, seed: int = 0) -> bytes:
    """A random RGB PNG."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def small_processor_config(path: Path) -> None:
    """A ``preprocessor_config.json`` keeping tiny test images small (8-pixel patches)."""
    config = {"patch_size": 8, "temporal_patch_size": 2, "merge_size": 2,
              "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
              "size": {"shortest_edge": 16 * 16 * 4, "longest_edge": 64 * 64}}
    (path / "preprocessor_config.json").write_text(json.dumps(config))


def greedy_with_image(path, backend: str):
    """On ``backend``: the tower's features of a 40 x 56 image (host array) and 16 greedy tokens
    each of an image request and a text request run together (chunked prefill)."""
    from atlas_core.api import EngineArgs, LLMEngine, SamplingParams

    engine = LLMEngine.from_args(EngineArgs(model=str(path), backend=backend, max_num_seqs=4,
                                            num_kv_blocks=64, block_size=16,
                                            max_prefill_tokens=24, dtype="float32"))
    processor = engine.model.mm_processor
    images = processor.image_processor
    image = images.preprocess(images.decode(png_bytes(40, 56)))
    features = engine.model.encode_images([image.pixel_values], [image.grid_thw])[0]
    embeds = engine.backend.to_host(features.embeds)
    ids, mm = processor.process([10, 20, 383, 30, 40, 50], [png_bytes(40, 56)])
    engine.add_request("img", ids, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True),
                       mm_inputs=mm)
    engine.add_request("text", list(range(5, 30)),
                       SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    return embeds, done
