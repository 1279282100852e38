"""The ``memory`` StorageBackend: KV blocks kept in a host dict."""

from __future__ import annotations

from typing import Any

from atlas_core.interfaces import StorageBackend


class MemoryStorage(StorageBackend):
    """Key -> bytes in process memory (tests, and host-RAM offload of evicted KV blocks).

    Args:
        **options: factory options (``root``…) are ignored.
    """

    def __init__(self, **options: Any) -> None:
        self._data: dict[str, bytes] = {}

    async def write(self, key: str, data: bytes) -> None:
        self._data[_check_key(key)] = bytes(data)

    async def read(self, key: str) -> bytes:
        try:
            return self._data[key]
        except KeyError:
            raise KeyError(f"no stored block under key {key!r}") from None

    async def delete(self, key: str) -> None:
        self._data.pop(key, None)

    def contains(self, key: str) -> bool:
        return key in self._data

    def keys(self) -> list[str]:
        return sorted(self._data)

    def used_bytes(self) -> int:
        return sum(len(v) for v in self._data.values())

    def close(self) -> None:
        self._data.clear()


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"storage keys must be non-empty strings, got {key!r}")
    return key
