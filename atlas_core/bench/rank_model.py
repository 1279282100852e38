"""One rank's share of a split model, alone in one process, its collectives moving nothing.

``build_rank_model(config, backend, registry, tp=2)`` builds rank ``rank``'s tensor- (or
expert-) parallel shard of a named shape with random weights, exactly as a worker of
``atlas serve -tp N --load-format dummy`` does, but over :class:`SilentComm`: every all-reduce
returns its input and every all-gather returns a buffer of the gathered shape without writing
it. Timing that rank's decode graph (``scripts/decode_timeline.py --tp N``,
``scripts/decode_leave_one_out.py --tp N``) gives what the split costs without communication:
the real ``-tp N`` step minus this is the price of the collectives, and this minus the rank's
floor is the price of the narrower kernels.

The outputs are meaningless (random weights, partial sums never summed); only times count.
"""

from __future__ import annotations

from typing import Any

from atlas_core.model.loader import architecture, create_loader

__all__ = ["SilentComm", "build_rank_model"]


class SilentComm:
    """Rank ``rank`` of ``world_size`` ranks that never talk: ``all_reduce`` is the identity,
    ``all_gather`` returns an unwritten buffer of ``world_size`` times the rows (from the
    backend's step workspace when it has one, so graph capture stays legal)."""

    def __init__(self, backend: Any, world_size: int, rank: int = 0) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside a world of {world_size}")
        self.backend, self.rank, self.world_size = backend, rank, world_size

    def all_reduce(self, array: Any, op: str = "sum") -> Any:
        return array

    def all_gather(self, array: Any, axis: int = 0) -> Any:
        shape = (self.world_size * array.shape[0], *array.shape[1:])
        ctx = getattr(self.backend, "ctx", None)
        if ctx is not None:
            return ctx.out(shape, array.dtype)
        import numpy as np
        return np.concatenate([array] * self.world_size, axis=0)

    def reduce_scatter(self, array: Any, op: str = "sum") -> Any:
        return array[: array.shape[0] // self.world_size]

    def all_to_all(self, arrays: list[Any]) -> list[Any]:
        return list(arrays)

    def barrier(self) -> None:
        """Nothing to wait for."""


def build_rank_model(config: dict[str, Any], backend: Any, registry: Any, tp: int,
                     expert_parallel: bool = False, rank: int = 0, seed: int = 0) -> Any:
    """Rank ``rank``'s shard of ``config`` split ``tp`` ways (see the module docstring)."""
    from atlas_core.parallel.transform import build_random_shard
    loader = create_loader(registry, architecture(config))
    return build_random_shard(loader, config, backend, SilentComm(backend, tp, rank),
                              expert_parallel=expert_parallel, seed=seed)
