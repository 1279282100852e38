"""A model checkpoint: one or more safetensors files seen as one name -> tensor mapping."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import numpy as np

from atlas_core.weights.quantization import SUPPORTED, UnsupportedQuantizationError
from atlas_core.weights.safetensors_file import CheckpointError, SafetensorsFile

INDEX_FILE = "model.safetensors.index.json"


class Checkpoint:
    """Tensors of a (possibly sharded) safetensors checkpoint, read lazily through mmap.

    >>> ckpt = Checkpoint.open("/models/Qwen3-0.6B")
    >>> ckpt.shape("model.embed_tokens.weight")
    (151936, 1024)

    Args:
        files: the opened shard files.
        weight_map: tensor name -> shard file name (from the index); default: every tensor of
            every file, in file order.
    """

    def __init__(self, files: list[SafetensorsFile], weight_map: dict[str, str] | None = None) -> None:
        self.files = {f.path.name: f for f in files}
        self._where: dict[str, SafetensorsFile] = {}
        if weight_map is None:
            for f in files:
                for name in f.tensors:
                    self._where.setdefault(name, f)
            return
        for name, file_name in weight_map.items():
            f = self.files[file_name]
            if name not in f.tensors:
                raise CheckpointError(f"{f.path}: tensor {name!r} listed in {INDEX_FILE} is not in "
                                      "this shard (the index and the shards do not match)")
            self._where[name] = f

    @classmethod
    def open(cls, path: str | os.PathLike) -> "Checkpoint":
        """Open a directory (``model.safetensors.index.json`` or ``*.safetensors``) or one file.

        Raises:
            CheckpointError: no safetensors files, an unreadable index, a missing shard, or a
                corrupt file (:class:`UnsupportedQuantizationError` for GGUF files).
        """
        path = Path(path)
        ggufs = [path] if path.suffix == ".gguf" else sorted(path.glob("*.gguf"))
        if ggufs and not (path.is_dir() and any(path.glob("*.safetensors"))):
            raise UnsupportedQuantizationError(
                f"{ggufs[0]}: GGUF files (llama.cpp's format) are not supported; Atlas loads "
                f"{SUPPORTED} in safetensors: use the model's Hugging Face release")
        if path.is_file():
            return cls([SafetensorsFile(path)])
        if not path.is_dir():
            raise CheckpointError(f"{path}: no such file or directory")
        index = path / INDEX_FILE
        if index.is_file():
            return cls._open_index(index)
        shards = sorted(path.glob("*.safetensors"))
        if not shards:
            raise CheckpointError(f"{path}: no *.safetensors files (Atlas loads safetensors "
                                  "checkpoints only; convert .bin / .pt weights first)")
        return cls([SafetensorsFile(p) for p in shards])

    @classmethod
    def _open_index(cls, index: Path) -> "Checkpoint":
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: not a valid safetensors index ({exc})") from None
        files = []
        for file_name in sorted(set(weight_map.values())):
            shard = index.parent / file_name
            if not shard.is_file():
                raise CheckpointError(f"{index}: shard {file_name!r} is missing from {index.parent} "
                                      "(the download is incomplete; fetch the model again)")
            files.append(SafetensorsFile(shard))
        return cls(files, weight_map)

    def names(self) -> list[str]:
        """Every tensor name, in file order."""
        return list(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def _file(self, name: str) -> SafetensorsFile:
        try:
            return self._where[name]
        except KeyError:
            raise KeyError(f"tensor {name!r} is not in the checkpoint") from None

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor ``name`` (no data read)."""
        return self._file(name).tensors[name].shape

    def dtype(self, name: str) -> np.dtype:
        """NumPy dtype of tensor ``name`` (no data read)."""
        return self._file(name).numpy_dtype(name)

    def file_of(self, name: str) -> Path:
        """The shard file holding tensor ``name``."""
        return self._file(name).path

    def get(self, name: str) -> np.ndarray:
        """Read-only host view of tensor ``name``, backed by the file's mmap."""
        return self._file(name).get(name)

    @property
    def nbytes(self) -> int:
        """Total bytes of tensor data."""
        return sum(f.tensors[n].end - f.tensors[n].start for n, f in self._where.items())
