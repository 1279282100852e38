"""Tiny random-weight checkpoints in real Hugging Face format, for every registered architecture.

``write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path)`` writes ``config.json`` (the loader's
:meth:`~atlas_core.interfaces.ModelWeightLoader.tiny_config` plus overrides),
``model.safetensors`` (or two shards and an index), ``generation_config.json``, and a small
deterministic byte-level BPE ``tokenizer.json`` + ``tokenizer_config.json`` with a ChatML chat
template. HF transformers loads the same directory, which is what the logit-parity tests use.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from atlas_core.ops._dtypes import as_dtype
from atlas_core.plugins import Registry
from atlas_core.testing.tiny_tokenizer import write_tokenizer
from atlas_core.weights.checkpoint import INDEX_FILE
from atlas_core.weights.safetensors_file import write_safetensors


def tiny_architectures(registry: Registry | None = None) -> list[str]:
    """Every architecture registered under ``weight_loaders``, sorted."""
    return (registry if registry is not None else Registry()).names("weight_loaders")


def tiny_config(architecture: str, registry: Registry | None = None,
                **overrides: Any) -> dict[str, Any]:
    """The loader's tiny config merged with ``overrides``.

    Raises:
        ValueError: the loader offers no tiny config.
    """
    registry = registry if registry is not None else Registry()
    loader = registry.create("weight_loaders", architecture, registry=registry)
    base = loader.tiny_config()
    if base is None:
        raise ValueError(f"the {architecture} loader has no tiny_config(); implement it to get "
                         "tiny test checkpoints")
    config = {**base, **overrides}
    config.setdefault("architectures", [architecture])
    return config


def random_tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random float32 weights that keep activations O(1): norms near 1, fan-in scaled matrices."""
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
    if len(shape) <= 1:
        return 0.1 * rng.standard_normal(shape, dtype=np.float32)
    if name.endswith("embed_tokens.weight"):
        return rng.standard_normal(shape, dtype=np.float32)
    return rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1], dtype=np.float32)


def _write_weights(path: Path, tensors: dict[str, np.ndarray], shards: int) -> None:
    if shards <= 1:
        write_safetensors(path / "model.safetensors", tensors, {"format": "pt"})
        return
    names = list(tensors)
    weight_map = {}
    for i, chunk in enumerate(np.array_split(np.arange(len(names)), shards)):
        file_name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(path / file_name, {names[j]: tensors[names[j]] for j in chunk},
                          {"format": "pt"})
        weight_map.update({names[j]: file_name for j in chunk})
    total = sum(t.nbytes for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / INDEX_FILE).write_text(json.dumps(index, indent=2))


def write_tiny_checkpoint(architecture: str, path: str | os.PathLike, *, dtype: str = "float32",
                          seed: int = 0, shards: int = 1, registry: Registry | None = None,
                          **config_overrides: Any) -> Path:
    """Write a tiny random model of ``architecture`` as an HF model directory.

    Args:
        architecture: a registered ``architectures`` string, e.g. ``"Qwen3ForCausalLM"``.
        path: output directory (created).
        dtype: weight dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        seed: weights seed (the tokenizer is always the same for a given ``vocab_size``).
        shards: 1 for ``model.safetensors``, more for shards plus ``model.safetensors.index.json``.
        registry: plugin registry (default: a fresh one).
        **config_overrides: config.json fields replacing the loader's tiny defaults.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    registry = registry if registry is not None else Registry()
    config = tiny_config(architecture, registry, **config_overrides)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(path, config["vocab_size"], config.get("max_position_embeddings", 4096))
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    config.update(torch_dtype=dtype, bos_token_id=ids["<|endoftext|>"], eos_token_id=eos[1],
                  pad_token_id=ids["<|endoftext|>"])
    loader = registry.create("weight_loaders", architecture, registry=registry)
    shapes = loader.checkpoint_tensors(config)
    if not shapes:
        raise ValueError(f"the {architecture} loader does not list its checkpoint_tensors()")
    rng = np.random.default_rng(seed)
    np_dtype = as_dtype(dtype)
    tensors = {n: random_tensor(n, s, rng).astype(np_dtype) for n, s in shapes.items()}
    _write_weights(path, tensors, shards)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": eos,
                  "pad_token_id": ids["<|endoftext|>"], "do_sample": False}
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return path
