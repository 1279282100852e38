"""Tiny Nemotron-H checkpoints saved by HF transformers (torch CPU, test-only), with the tiny
byte-level tokenizer of :mod:`atlas_core.testing` and, optionally, a real Nemotron chat
template. Imported by the tests of this folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from atlas_core.testing import checkpoints
from atlas_core.testing.fixtures import real_models_dir

ARCH = "NemotronHForCausalLM"
TEMPLATES = {"nano3": real_models_dir() / "nemotron" / "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
             "nano_v2": real_models_dir() / "nemotron" / "NVIDIA-Nemotron-Nano-v2.jinja"}


def randomize(model: Any, seed: int) -> None:
    """Weights that keep activations O(1) and make every part matter: the shared rules of
    :func:`~atlas_core.testing.checkpoints.randomize_hf_weights`, with decay rates
    ``exp(A_log)`` in 0.5..4, time-step biases around 0 (softplus ~0.7, far above
    ``time_step_min``) and routing biases of the size of the score spread."""
    checkpoints.randomize_hf_weights(model, seed, special=_nemotron_value)


def _nemotron_value(name: str, tensor: Any, noise: Any, gen: Any) -> Any:
    import torch

    if name.endswith("norm_f.weight"):
        return 1.0 + 0.1 * noise
    if name.endswith("A_log"):
        return torch.log(0.5 + 3.5 * torch.rand(tensor.shape, generator=gen))
    if name.endswith(("dt_bias", "e_score_correction_bias")):
        return 0.3 * noise
    if name.endswith("embeddings.weight"):
        return noise
    return None


def save_hf_checkpoint(path: Path, *, seed: int = 0, dtype: str = "float32", registry=None,
                       template: str | None = None, **overrides: Any) -> Path:
    """``NemotronHForCausalLM(config).save_pretrained(path)`` for this plugin's tiny config
    (plus ``overrides``), random weights, the tiny tokenizer; a real chat template
    (``"nano3"`` or ``"nano_v2"``) when ``template``."""
    return checkpoints.save_hf_checkpoint(
        path, ARCH, seed=seed, dtype=dtype, registry=registry, randomize=randomize,
        chat_template=TEMPLATES[template] if template is not None else None, **overrides)


def prompt(seed: int, n: int, vocab: int = 370) -> list[int]:
    """``n`` random token ids below ``vocab`` (the tiny tokenizer's ordinary tokens)."""
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def save_model_prefixed(src: Path, out: Path) -> Path:
    """The checkpoint at ``src`` as HF transformers 5 saves it: the body under ``model.``
    instead of ``backbone.`` and every MoE's experts stacked (``experts.up_proj``
    ``[num_experts, inner, hidden]``); config and tokenizer copied."""
    from atlas_core.api import Checkpoint

    ckpt = Checkpoint.open(src)
    tensors, experts = {}, {}
    for name in ckpt.names():
        renamed = "model." + name[len("backbone."):] if name.startswith("backbone.") else name
        parts = renamed.split(".")
        if ".experts." in renamed and parts[-2] in ("up_proj", "down_proj"):
            experts.setdefault((".".join(parts[:5]), parts[-2]), {})[int(parts[5])] = ckpt.get(name)
            continue
        tensors[renamed] = np.array(ckpt.get(name))
    for (prefix, proj), rows in experts.items():
        tensors[f"{prefix}.{proj}"] = np.stack([rows[e] for e in sorted(rows)])
    return checkpoints.rewrite_checkpoint(src, out, tensors)
