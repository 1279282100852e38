"""The ``loopback`` CommBackend: a world of one rank, where every collective is the identity."""

from __future__ import annotations

from typing import Any

from atlas_core.interfaces import CommBackend

_REDUCE_OPS = ("sum", "max", "min")


class LoopbackComm(CommBackend):
    """Rank 0 of a world of size 1 (single-GPU serving, and tests of parallel-aware code).

    ``all_reduce`` and ``all_gather`` return their input (the only rank's contribution);
    ``all_to_all`` returns its list unchanged.

    Args:
        rank: must be 0.
        world_size: must be 1.
        **options: other factory options are ignored.
    """

    def __init__(self, rank: int = 0, world_size: int = 1, **options: Any) -> None:
        if world_size != 1 or rank != 0:
            raise ValueError(f"loopback comm is a single rank (rank 0, world_size 1), got rank "
                             f"{rank} of {world_size}; use a multi-GPU comm backend such as nccl")
        self.rank = 0
        self.world_size = 1

    def all_reduce(self, array: Any, op: str = "sum") -> Any:
        if op not in _REDUCE_OPS:
            raise ValueError(f"unsupported all_reduce op {op!r}; use one of {', '.join(_REDUCE_OPS)}")
        return array

    def all_gather(self, array: Any, axis: int = 0) -> Any:
        return array

    def all_to_all(self, arrays: list[Any], recv_rows: list[int] | None = None) -> list[Any]:
        if len(arrays) != self.world_size:
            raise ValueError(f"all_to_all needs one array per rank ({self.world_size}), "
                             f"got {len(arrays)}")
        if recv_rows is not None and list(recv_rows) != [arrays[0].shape[0]]:
            raise ValueError(f"all_to_all: recv_rows {list(recv_rows)} but this rank sends "
                             f"itself {arrays[0].shape[0]} rows")
        return list(arrays)

    def all_to_all_rows(self, send_rows: list[int]) -> list[int]:
        return [int(n) for n in send_rows]
