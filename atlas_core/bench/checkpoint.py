"""Fast random-weight checkpoints of any size (for speed, not quality)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from atlas_core.ops._dtypes import as_dtype
from atlas_core.plugins import Registry
from atlas_core.weights.safetensors_file import write_safetensors

_POOL = 1 << 20
SHARD_BYTES = 4 << 30


def _tensor(name: str, shape: tuple[int, ...], pool: np.ndarray, dtype: np.dtype) -> np.ndarray:
    # Tiling one random pool is ~100x faster than drawing billions of normals; the weights
    # stay O(1 / sqrt(fan_in)) so activations neither vanish nor overflow.
    if len(shape) == 1:
        return (1.0 + 0.05 * np.resize(pool, shape[0])).astype(dtype)
    scale = 1.0 if name.endswith("embed_tokens.weight") else 1.0 / np.sqrt(shape[-1])
    flat = np.resize((pool * scale).astype(dtype), int(np.prod(shape)))
    return flat.reshape(shape)


def write_bench_tokenizer(path: Path, vocab_size: int) -> int:
    """A word-level tokenizer of exactly ``vocab_size`` tokens (instant to build at any size,
    unlike a trained BPE); returns the end-of-text id (the last token)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {f"t{i}": i for i in range(vocab_size - 1)}
    vocab["<|endoftext|>"] = vocab_size - 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
              "pad_token": "<|endoftext|>", "model_max_length": 1 << 20}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return vocab_size - 1


def write_random_checkpoint(config: dict[str, Any], path: str | Path, dtype: str = "bfloat16",
                            seed: int = 0) -> Path:
    """Write ``config`` as an HF model directory with random weights and a byte-level tokenizer.

    Reuses ``path`` when it already holds the same config.
    """
    path = Path(path)
    config = {**config, "torch_dtype": dtype}
    requested = dict(config)
    marker = path / "bench_config.json"
    if marker.is_file() and json.loads(marker.read_text()) == config:
        return path
    path.mkdir(parents=True, exist_ok=True)
    eos = write_bench_tokenizer(path, config["vocab_size"])
    arch = config["architectures"][0]
    shapes = Registry().get("weight_loaders", arch)().checkpoint_tensors(config)
    pool = np.random.default_rng(seed).standard_normal(_POOL).astype(np.float32)
    np_dtype = as_dtype(dtype)
    shard, size, files, weight_map = {}, 0, [], {}

    def flush():
        name = f"model-{len(files) + 1:05d}.safetensors"
        write_safetensors(path / name, shard, {"format": "pt"})
        files.append(name)
        weight_map.update({k: name for k in shard})

    for name, shape in shapes.items():
        shard[name] = _tensor(name, tuple(shape), pool, np_dtype)
        size += shard[name].nbytes
        if size >= SHARD_BYTES:
            flush()
            shard, size = {}, 0
    if shard:
        flush()
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    config.update(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    marker.write_text(json.dumps(requested))
    return path
