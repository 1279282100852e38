"""The ``posix`` StorageBackend: one file per KV block in a directory."""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from pathlib import Path
from typing import Any

from atlas_core import env
from atlas_core.interfaces import StorageBackend

_SAFE = re.compile(r"[a-z0-9_-]")
_MAX_NAME = 240


def key_to_filename(key: str) -> str:
    """Reversible safe file name for ``key``: ``[a-z0-9_-]`` kept, other UTF-8 bytes ``%XX``.

    Encoded names never contain ``.`` or ``/``, so they cannot escape the directory or collide
    with the ``.``-prefixed temporary files of in-flight writes; escaping capitals keeps keys
    distinct on case-insensitive file systems (macOS).
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"storage keys must be non-empty strings, got {key!r}")
    name = "".join(c if _SAFE.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode())
                   for c in key)
    if len(name) > _MAX_NAME:
        raise ValueError(f"storage key {key[:40]!r}... is too long: it encodes to {len(name)} "
                         f"characters, the limit is {_MAX_NAME}; use shorter keys (block hashes)")
    return name


def filename_to_key(name: str) -> str:
    """Inverse of :func:`key_to_filename`."""
    out, i = bytearray(), 0
    while i < len(name):
        if name[i] == "%":
            out.append(int(name[i + 1:i + 3], 16))
            i += 3
        else:
            out += name[i].encode()
            i += 1
    return out.decode()


def temp_name(name: str) -> str:
    """Name of the temporary file a write of ``name`` goes through (carries the writer's pid)."""
    return f".{name}.{os.getpid()}.{uuid.uuid4().hex}.tmp"


def remove_dead_temp_files(root: Path) -> int:
    """Delete temporary files left by writers that died mid-write (``kill -9``, power loss);
    returns how many. Files of live processes (another server on the same directory) stay."""
    removed = 0
    for path in root.glob(".*.tmp"):
        parts = path.name.rsplit(".", 3)
        if len(parts) == 4 and parts[1].isdigit() and _is_alive(int(parts[1])):
            continue
        path.unlink(missing_ok=True)
        removed += 1
    return removed


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class BlockDirectory(StorageBackend):
    """A directory of one file per block (names from :func:`key_to_filename`): lookup,
    listing, deletion and the clean-up of writes that died; subclasses do the reads and
    writes (``posix`` through the page cache, ``io_uring`` through a ring), always through a
    temporary file (:func:`temp_name`) renamed over the block's name.

    Args:
        root: directory to keep blocks in (created if missing).
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.num_torn_writes = remove_dead_temp_files(self.root)

    def _path(self, key: str) -> Path:
        return self.root / key_to_filename(key)

    async def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def contains(self, key: str) -> bool:
        return self._path(key).is_file()

    def keys(self) -> list[str]:
        return sorted(filename_to_key(p.name) for p in self.root.iterdir()
                      if not p.name.startswith("."))

    def used_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.iterdir() if not p.name.startswith("."))


class PosixStorage(BlockDirectory):
    """Blocks as files under ``root``; writes are atomic (temporary file, then rename).

    Args:
        root: directory to keep blocks in (created if missing); default
            ``$ATLAS_CACHE_DIR/kv-blocks``.
        **options: other factory options are ignored.
    """

    def __init__(self, root: str | os.PathLike | None = None, **options: Any) -> None:
        super().__init__(root if root is not None else env.cache_dir() / "kv-blocks")

    def _write(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = self.root / temp_name(path.name)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _read(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise KeyError(f"no stored block under key {key!r} in {self.root}") from None

    def _read_into(self, key: str, buffer: memoryview) -> int:
        view = memoryview(buffer).cast("B")
        try:
            f = open(self._path(key), "rb", buffering=0)
        except FileNotFoundError:
            raise KeyError(f"no stored block under key {key!r} in {self.root}") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            if size > view.nbytes:
                raise BufferError(f"{f.name} is {size} bytes, the buffer {view.nbytes}")
            done = 0
            while done < size:
                n = f.readinto(view[done:size])
                if not n:
                    break  # shrank under us: the short length fails the caller's checks
                done += n
        return done

    async def write(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self._write, key, bytes(data))

    async def read(self, key: str) -> bytes:
        return await asyncio.to_thread(self._read, key)

    async def read_into(self, key: str, buffer: memoryview) -> int:
        """Through the page cache straight into ``buffer`` (no intermediate ``bytes``)."""
        return await asyncio.to_thread(self._read_into, key, buffer)
