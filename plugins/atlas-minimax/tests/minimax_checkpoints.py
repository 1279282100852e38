"""Tiny MiniMax-M2 checkpoints saved by HF transformers (torch CPU, test-only), with the tiny
byte-level tokenizer of :mod:`atlas_core.testing` and, optionally, the real MiniMax-M2 chat
template. Imported by the tests of this folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from atlas_core.testing.checkpoints import tiny_config
from atlas_core.testing.fixtures import real_models_dir
from atlas_core.testing.tiny_tokenizer import write_tokenizer

ARCH = "MiniMaxM2ForCausalLM"
TEMPLATE = real_models_dir() / "minimax-m2" / "MiniMax-M2.jinja"


def randomize(model: Any, seed: int) -> None:
    """Weights that keep activations O(1) and make the routing bias matter: fan-in scaled
    matrices, norms near 1, correction biases of the size of the sigmoid score spread."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                value = 1.0 + 0.1 * noise
            elif name.endswith("e_score_correction_bias"):
                value = 0.2 * noise
            elif name.endswith("embed_tokens.weight") or tensor.dim() < 2:
                value = noise
            else:
                value = noise / tensor.shape[-1] ** 0.5
            tensor.copy_(value.to(tensor.dtype))


def save_hf_checkpoint(path: Path, *, seed: int = 0, dtype: str = "float32", registry=None,
                       chat_template: bool = False, **overrides: Any) -> Path:
    """``MiniMaxM2ForCausalLM(config).save_pretrained(path)`` for this plugin's tiny config
    (plus ``overrides``), random weights, the tiny tokenizer; the real M2 chat template when
    ``chat_template``."""
    import torch
    import transformers

    config = tiny_config(ARCH, registry, **overrides)
    path.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(path, config["vocab_size"], config["max_position_embeddings"])
    config.update(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                  pad_token_id=ids["<|endoftext|>"])
    hf_config = transformers.MiniMaxM2Config(**config)
    model = transformers.MiniMaxM2ForCausalLM(hf_config).eval()
    randomize(model, seed)
    model.to(getattr(torch, dtype)).save_pretrained(path)
    if chat_template:
        tok_config = json.loads((path / "tokenizer_config.json").read_text())
        tok_config["chat_template"] = TEMPLATE.read_text(encoding="utf-8")
        (path / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return path
