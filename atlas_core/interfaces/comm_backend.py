"""CommBackend: collective communication between ranks (tensor / expert parallelism)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class CommBackend(ABC):
    """Collectives over device arrays of one GpuBackend.

    Required: ``rank``, ``world_size``, :meth:`all_reduce`, :meth:`all_gather`.
    Optional: :meth:`reduce_scatter`, :meth:`all_to_all`, :meth:`send`, :meth:`recv`,
    :meth:`barrier`, :meth:`abort`, :meth:`close`.
    """

    rank: int
    world_size: int

    @abstractmethod
    def all_reduce(self, array: Any, op: str = "sum") -> Any:
        """Reduce ``array`` across ranks (``op`` in sum/max/min) and return the result."""

    @abstractmethod
    def all_gather(self, array: Any, axis: int = 0) -> Any:
        """Concatenate every rank's ``array`` along ``axis``."""

    def reduce_scatter(self, array: Any, op: str = "sum") -> Any:
        """Optional. Reduce ``array`` ``[world_size * n, ...]``; return this rank's ``n`` rows."""
        raise NotImplementedError(f"{type(self).__name__} does not implement reduce_scatter")

    def all_to_all(self, arrays: list[Any], recv_rows: list[int] | None = None) -> list[Any]:
        """Optional. Send ``arrays[r]`` to rank r; return what each rank sent here.

        Without ``recv_rows`` every rank sends every peer arrays of one shape. With it
        (all-to-all-v) the arrays may differ in their first dimension (the rest of the shape
        and the dtype are every array's) and ``recv_rows[r]`` is how many rows rank r sends
        here (:meth:`all_to_all_rows` exchanges them)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement all_to_all")

    def all_to_all_rows(self, send_rows: list[int]) -> list[int]:
        """Optional. The rows each rank sends here, given ``send_rows[r]``, the rows this rank
        sends rank r (an all-to-all of the counts; a host sync, so not inside a captured
        graph): the ``recv_rows`` of :meth:`all_to_all`."""
        raise NotImplementedError(f"{type(self).__name__} does not implement all_to_all_rows")

    def send(self, array: Any, dst: int) -> None:
        """Optional. Point-to-point send."""
        raise NotImplementedError(f"{type(self).__name__} does not implement send")

    def recv(self, array: Any, src: int) -> Any:
        """Optional. Point-to-point receive into ``array``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement recv")

    def barrier(self) -> None:
        """Optional. Wait for every rank."""

    def abort(self) -> None:
        """Optional. End collectives in flight (a peer died); called from another thread.
        The default closes the backend."""
        self.close()

    def close(self) -> None:
        """Optional. Release resources."""
