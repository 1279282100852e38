"""StorageBackend: where evicted KV blocks go (host memory, files, io_uring…)."""

from __future__ import annotations

from abc import ABC, abstractmethod


class StorageBackend(ABC):
    """Key -> bytes store for KV blocks, asynchronous by contract.

    Keys are strings (block content hashes). Reads of a missing key raise ``KeyError``.

    Required: :meth:`write`, :meth:`read`, :meth:`delete`, :meth:`contains`.
    Optional: :meth:`read_into`, :meth:`keys`, :meth:`used_bytes`, :meth:`close`,
    :attr:`num_torn_writes`.

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

    async def read_into(self, key: str, buffer: memoryview) -> int:
        """Optional. Read the bytes stored under ``key`` into the start of ``buffer`` (a
        writable, contiguous byte buffer) and return how many there are.

        The KV disk tier reads records straight into page-locked host rows this way, so a block
        crosses host memory once. ``buffer`` starts on a page boundary and spans whole pages
        where the tier can arrange it (its host rows): a backend that bypasses the page cache
        (``O_DIRECT``) reads into it with no bounce buffer then, and through one otherwise.

        Raises:
            KeyError: nothing is stored under ``key``.
            BufferError: the stored value is longer than ``buffer`` (its bytes are not read).

        Default: :meth:`read`, then a copy into ``buffer``."""
        data = await self.read(key)
        view = memoryview(buffer).cast("B")
        n = memoryview(data).nbytes
        if n > view.nbytes:
            raise BufferError(f"the value under {key!r} is {n} bytes, the buffer {view.nbytes}")
        view[:n] = memoryview(data).cast("B")
        return n

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
