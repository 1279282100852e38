"""Tiny MiniMax-M2 checkpoints saved by HF transformers (torch CPU, test-only), with the tiny
byte-level tokenizer of :mod:`atlas_core.testing` and, optionally, the real MiniMax-M2 chat
template. Imported by the tests of this folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from atlas_core.testing import checkpoints
from atlas_core.testing.fixtures import real_models_dir

ARCH = "MiniMaxM2ForCausalLM"
TEMPLATE = real_models_dir() / "minimax-m2" / "MiniMax-M2.jinja"


def save_hf_checkpoint(path: Path, *, seed: int = 0, dtype: str = "float32", registry=None,
                       chat_template: bool = False, **overrides: Any) -> Path:
    """``MiniMaxM2ForCausalLM(config).save_pretrained(path)`` for this plugin's tiny config
    (plus ``overrides``), random weights that make the routing bias matter, the tiny tokenizer;
    the real M2 chat template when ``chat_template``."""
    return checkpoints.save_hf_checkpoint(path, ARCH, seed=seed, dtype=dtype, registry=registry,
                                          chat_template=TEMPLATE if chat_template else None,
                                          **overrides)
