"""Tiny random-weight checkpoints in real Hugging Face format, for every registered architecture.

``write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path)`` writes ``config.json`` (the loader's
:meth:`~atlas_core.interfaces.ModelWeightLoader.tiny_config` plus overrides),
``model.safetensors`` (or two shards and an index), ``generation_config.json``, and a small
deterministic byte-level BPE ``tokenizer.json`` + ``tokenizer_config.json`` with a ChatML chat
template. HF transformers loads the same directory, which is what the logit-parity tests use.

For HF parity the other way round, :func:`save_hf_checkpoint` has transformers itself build and
save the tiny model (random weights from :func:`randomize_hf_weights`, the same tokenizer);
:func:`hf_float64_model` and :func:`hf_logits` give the reference logits. These import torch and
transformers when called, never when this module is imported. :func:`rewrite_checkpoint` writes
a model directory again with other tensors (another exporter's layout of the same weights).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

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


#: The files besides the weights that :func:`rewrite_checkpoint` carries over.
MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")


def write_weights(path: Path, tensors: dict[str, np.ndarray], shards: int = 1) -> None:
    """``tensors`` as ``model.safetensors`` in ``path``, or as ``shards`` files plus the index HF
    writes for sharded checkpoints."""
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
    write_weights(path, tensors, shards)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": eos,
                  "pad_token_id": ids["<|endoftext|>"], "do_sample": False}
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return path


def rewrite_checkpoint(src: str | os.PathLike, out: str | os.PathLike,
                       tensors: dict[str, np.ndarray]) -> Path:
    """The model directory ``src`` with other weights: ``tensors`` as ``out/model.safetensors``,
    and the :data:`MODEL_FILES` of ``src`` that exist copied unchanged (a family's tests write
    the layouts other exporters use this way).

    Returns:
        ``out`` as a :class:`~pathlib.Path`.
    """
    src, out = Path(src), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_weights(out, tensors)
    for name in MODEL_FILES:
        if (src / name).is_file():
            (out / name).write_bytes((src / name).read_bytes())
    return out


def randomize_hf_weights(model: Any, seed: int,
                         special: Callable[[str, Any, Any, Any], Any] | None = None) -> None:
    """Give an HF torch model weights that keep activations O(1) and make routing matter:
    fan-in scaled matrices, norms near 1, ``e_score_correction_bias`` of the size of the sigmoid
    score spread, unit noise for embeddings and vectors. Integer tensors and the rotary
    embedding's buffers keep their values.

    Args:
        model: the torch model, changed in place.
        seed: seed of the one generator every tensor's noise is drawn from, in module order.
        special: ``(name, tensor, noise, generator)`` giving a family's value for the tensors
            its architecture names differently or needs in another range, None for the rest
            (which get the values above).
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if not tensor.is_floating_point() or "rotary_emb" in name:
                continue
            noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32)
            value = special(name, tensor, noise, gen) if special is not None else None
            if value is None:
                value = _hf_weight_value(name, tensor, noise)
            tensor.copy_(value.to(tensor.dtype))


def _hf_weight_value(name: str, tensor: Any, noise: Any) -> Any:
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * noise
    if name.endswith("e_score_correction_bias"):
        return 0.2 * noise
    if name.endswith("embed_tokens.weight") or tensor.dim() < 2:
        return noise
    return noise / tensor.shape[-1] ** 0.5


def save_hf_checkpoint(path: str | os.PathLike, architecture: str, *, seed: int = 0,
                       dtype: str = "float32", registry: Registry | None = None,
                       randomize: Callable[[Any, int], None] = randomize_hf_weights,
                       chat_template: str | os.PathLike | None = None,
                       **overrides: Any) -> Path:
    """``<architecture>(config).save_pretrained(path)`` by HF transformers, with the tiny
    tokenizer.

    Args:
        path: output directory (created).
        architecture: a class name of both transformers and a registered loader.
        seed: weights seed.
        dtype: torch dtype the weights are saved in (``"float32"``, ``"bfloat16"``).
        registry: plugin registry (default: a fresh one).
        randomize: ``(model, seed)`` setting the weights (default :func:`randomize_hf_weights`).
        chat_template: a Jinja file put in ``tokenizer_config.json`` instead of the ChatML one.
        **overrides: fields replacing the loader's :func:`tiny_config` (``text_config`` for a
            multimodal wrapper).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    import torch
    import transformers

    config = tiny_config(architecture, registry, **overrides)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    text = config.get("text_config", config)
    ids = write_tokenizer(path, text["vocab_size"], text["max_position_embeddings"])
    config.update(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                  pad_token_id=ids["<|endoftext|>"])
    model_cls = getattr(transformers, architecture)
    model = model_cls(model_cls.config_class(**config)).eval()
    randomize(model, seed)
    model.to(getattr(torch, dtype)).save_pretrained(path)
    if chat_template is not None:
        tok_config = json.loads((path / "tokenizer_config.json").read_text())
        tok_config["chat_template"] = Path(chat_template).read_text(encoding="utf-8")
        (path / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return path


def hf_float64_model(architecture: str, path: str | os.PathLike) -> Any:
    """HF's ``architecture`` model of ``path``, loaded in float32 with eager experts and run in
    float64: the reference that float32 Atlas logits are compared with."""
    import torch
    import transformers

    model = getattr(transformers, architecture).from_pretrained(
        path, dtype=torch.float32, experts_implementation="eager")
    return model.to(torch.float64).eval()


def hf_logits(model: Any, ids: list[int]) -> np.ndarray:
    """An HF model's logits at every position of ``ids``, ``[len(ids), vocab]``: float64 for a
    float64 model, else float32."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return (logits if logits.dtype == torch.float64 else logits.float()).numpy()
