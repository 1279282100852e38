"""StorageBackend: where evicted KV blocks go (host memory, files, io_uring…)."""

from __future__ import annotations

from abc import ABC, abstractmethod


class StorageBackend(ABC):
    """Key -> bytes store for KV blocks, asynchronous by contract.

    Keys are strings (block content hashes). Reads of a missing key raise ``KeyError``.

    Required: :meth:`write`, :meth:`read`, :meth:`delete`, :meth:`contains`.
    Optional: :meth:`keys`, :meth:`used_bytes`, :meth:`close`, :attr:`num_torn_writes`.

    The KV disk tier lists :meth:`keys` at start-up to find the blocks of earlier runs (a
    backend without it starts empty every run) and frames every value with a checksum, so a
    backend need not detect corruption itself; writes should still be atomic per key.
    """

    #: Optional. Leftovers of writes cut short (a killed process) found and removed when the
    #: store was opened; the KV disk tier counts them with its corrupt records.
    num_torn_writes: int = 0

    @abstractmethod
    async def write(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` (overwrites)."""

    @abstractmethod
    async def read(self, key: str) -> bytes:
        """Return the bytes stored under ``key``."""

    @abstractmethod
    async def delete(self, key: str) -> None:
        """Forget ``key`` (no error if absent)."""

    @abstractmethod
    def contains(self, key: str) -> bool:
        """Whether ``key`` is stored."""

    def keys(self) -> list[str]:
        """Optional. Every stored key."""
        raise NotImplementedError(f"{type(self).__name__} does not list keys")

    def used_bytes(self) -> int:
        """Optional. Bytes currently stored."""
        return 0

    def close(self) -> None:
        """Optional. Release resources."""
