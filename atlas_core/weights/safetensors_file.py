"""One ``.safetensors`` file read through ``mmap``: header parsed, tensors as NumPy views.

The format: 8 bytes little-endian header length ``N``, ``N`` bytes of JSON mapping each tensor
name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the end of the
header), then the raw little-endian data. Nothing is read until a tensor is asked for.
"""

from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

#: safetensors dtype string -> NumPy dtype.
DTYPES: dict[str, np.dtype] = {
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F16": np.dtype(np.float16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}

#: NumPy dtype -> safetensors dtype string (for writers).
DTYPE_NAMES: dict[np.dtype, str] = {v: k for k, v in DTYPES.items()}

# Real headers are at most a few MB; anything larger is a corrupt length field.
MAX_HEADER_BYTES = 100 * 1024 * 1024


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated or corrupt; the message names the file."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: its dtype string, shape and absolute byte range in the file."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


class SafetensorsFile:
    """A memory-mapped safetensors file.

    Args:
        path: the ``.safetensors`` file.

    Raises:
        CheckpointError: the file is missing, too short, or its header is not valid.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 8:
                    raise self._error(f"truncated: {size} bytes, shorter than the 8-byte header length")
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise CheckpointError(f"{self.path}: file not found") from None
        except IsADirectoryError:
            raise CheckpointError(f"{self.path}: is a directory, not a safetensors file") from None
        self.size = size
        self.metadata: dict[str, str] = {}
        self.tensors: dict[str, TensorInfo] = self._parse_header()

    def _error(self, problem: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: {problem} (re-download or re-export the checkpoint)")

    def _parse_header(self) -> dict[str, TensorInfo]:
        header_len = int.from_bytes(self._mmap[:8], "little")
        if header_len > min(self.size - 8, MAX_HEADER_BYTES):
            raise self._error(f"bad header length {header_len} for a file of {self.size} bytes")
        try:
            header = json.loads(bytes(self._mmap[8:8 + header_len]))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise self._error(f"header is not valid JSON ({exc})") from None
        if not isinstance(header, dict):
            raise self._error("header is not a JSON object")
        self.metadata = header.pop("__metadata__", None) or {}
        data_start = 8 + header_len
        tensors = {name: self._parse_entry(name, entry, data_start)
                   for name, entry in header.items()}
        self._check_disjoint(tensors, data_start)
        return tensors

    def _check_disjoint(self, tensors: dict[str, TensorInfo], data_start: int) -> None:
        """Two tensors sharing bytes would silently alias each other's data."""
        spans = sorted((t.start, t.end, n) for n, t in tensors.items() if t.end > t.start)
        for (start, end, name), (next_start, next_end, next_name) in zip(spans, spans[1:]):
            if next_start < end:
                raise self._error(
                    f"tensors {name!r} (data bytes {start - data_start}-{end - data_start}) and "
                    f"{next_name!r} (bytes {next_start - data_start}-{next_end - data_start}) "
                    "overlap; the safetensors format requires disjoint tensors, so the file is "
                    "corrupt or was written by a broken exporter")

    def _parse_entry(self, name: str, entry: object, data_start: int) -> TensorInfo:
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            shape = tuple(int(d) for d in shape)
            begin, end = int(begin), int(end)
        except (TypeError, KeyError, ValueError):
            raise self._error(f"tensor {name!r} has a malformed header entry {entry!r}") from None
        if min(shape, default=0) < 0 or not 0 <= begin <= end:
            raise self._error(f"tensor {name!r} has invalid shape {shape} or offsets [{begin}, {end}]")
        if data_start + end > self.size:
            raise self._error(f"tensor {name!r} ends at byte {data_start + end}, past the end of "
                              f"the file ({self.size} bytes): the file is truncated")
        if dtype in DTYPES and end - begin != int(np.prod(shape)) * DTYPES[dtype].itemsize:
            raise self._error(f"tensor {name!r}: {end - begin} bytes do not hold {dtype} {list(shape)}")
        return TensorInfo(dtype, shape, data_start + begin, data_start + end)

    def numpy_dtype(self, name: str) -> np.dtype:
        """NumPy dtype of tensor ``name`` (no data read)."""
        dtype = self.tensors[name].dtype
        if dtype not in DTYPES:
            raise self._error(f"tensor {name!r} has unsupported dtype {dtype}; "
                              f"supported: {', '.join(DTYPES)}")
        return DTYPES[dtype]

    def get(self, name: str) -> np.ndarray:
        """Read-only host view of tensor ``name`` backed by the mmap (no copy)."""
        info = self.tensors[name]
        dtype = self.numpy_dtype(name)
        count = (info.end - info.start) // dtype.itemsize
        if count == 0:
            empty = np.empty(info.shape, dtype=dtype)
            empty.flags.writeable = False
            return empty
        array = np.frombuffer(self._mmap, dtype=dtype, count=count, offset=info.start)
        return array.reshape(info.shape)


def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray],
                      metadata: dict[str, str] | None = None) -> Path:
    """Write ``tensors`` (any dtype of :data:`DTYPES`) as one safetensors file.

    The header is padded with spaces to a multiple of 8 bytes so every tensor is 8-aligned.
    """
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    arrays = []
    for name, array in tensors.items():
        array = np.asarray(array, order="C")
        if array.dtype not in DTYPE_NAMES:
            raise ValueError(f"tensor {name!r}: dtype {array.dtype} cannot be stored in safetensors")
        header[name] = {"dtype": DTYPE_NAMES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
        arrays.append(array)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path = Path(path)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for array in arrays:
            f.write(array.tobytes())
    return path
