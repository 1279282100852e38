"""Tiny random Gemma-4 checkpoints saved by HF transformers itself (test-only: torch CPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from atlas_gemma4.gemma3_loaders import Gemma3Loader
from atlas_gemma4.loaders import Gemma4Loader

MOE = {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32}


def hf_text_config(transformers: Any, gemma3: bool = False, **overrides: Any) -> Any:
    """A ``Gemma4TextConfig`` (``Gemma3TextConfig``) from the loader's tiny config plus
    ``overrides``."""
    loader = Gemma3Loader() if gemma3 else Gemma4Loader()
    fields = {k: v for k, v in loader.tiny_config().items()
              if k not in ("architectures", "model_type")}
    cls = transformers.Gemma3TextConfig if gemma3 else transformers.Gemma4TextConfig
    return cls(**{**fields, **overrides})


def randomize(torch: Any, model: Any, seed: int) -> None:
    """Weights that keep activations O(1): norms and scalars near 1, fan-in scaled matrices
    (HF's own init leaves norms at exactly 1 and logits near 0, which would hide bugs)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        scalars = [(n, b) for n, b in model.named_buffers() if n.endswith("layer_scalar")]
        for name, tensor in list(model.named_parameters()) + scalars:
            noise = torch.randn(tensor.shape, generator=gen)
            if "norm" in name or "scale" in name or "scalar" in name:
                tensor.copy_(1 + 0.1 * noise)
            elif "embed" in name:
                tensor.copy_(noise)
            else:
                tensor.copy_(noise / tensor.shape[-1] ** 0.5)


def save_hf_checkpoint(torch: Any, transformers: Any, path: Path, *, seed: int = 0,
                       dtype: str = "float32", gemma3: bool = False, **overrides: Any) -> Any:
    """``Gemma4ForCausalLM(config).save_pretrained(path)`` (``Gemma3ForCausalLM`` with
    ``gemma3``) with random weights; returns the HF model (eval mode, ``dtype``)."""
    cls = transformers.Gemma3ForCausalLM if gemma3 else transformers.Gemma4ForCausalLM
    model = cls(hf_text_config(transformers, gemma3, **overrides)).eval()
    randomize(torch, model, seed)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(path)
    return model


def as_conditional_generation(src: Path, dst: Path) -> Path:
    """Rewrite a ``Gemma4ForCausalLM`` checkpoint as the ``Gemma4ForConditionalGeneration``
    layout (``text_config``, ``model.language_model.*``) without vision or audio towers."""
    from safetensors.numpy import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    text = json.loads((src / "config.json").read_text())
    text.pop("architectures", None)
    config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
              "text_config": text, "tie_word_embeddings": True}
    (dst / "config.json").write_text(json.dumps(config))
    tensors = load_file(src / "model.safetensors")
    renamed = {name.replace("model.", "model.language_model.", 1): t for name, t in tensors.items()}
    save_file(renamed, dst / "model.safetensors", metadata={"format": "pt"})
    return dst
