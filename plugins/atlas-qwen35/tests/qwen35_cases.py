"""Test data shared by this plugin's tests (a uniquely named module: conftest is not importable)."""

from __future__ import annotations

import numpy as np

ARCHS = ("Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM")


def prompts(vocab_size: int = 384) -> list[list[int]]:
    """Three prompts of different lengths (one longer than a GDN chunk would be at size 8)."""
    rng = np.random.default_rng(7)
    return [rng.integers(0, vocab_size, n).tolist() for n in (11, 5, 19)]
