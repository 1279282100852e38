"""The parallel ops on the cuda backend (``kernels/parallel.cu``), registered by
:mod:`atlas_nccl.plugin` and bound to the backend's ``OpContext``; same signatures and results
as :mod:`atlas_core.parallel.ops` (the references). Imported only when a cuda backend builds
its op table."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

#: Threads per block of the row-wise kernels.
THREADS = 256


def kernel_dir() -> Path:
    """The ``.cu`` sources of this package (``parallel.cu``), searched by the cuda backend."""
    return Path(str(resources.files(__package__) / "kernels"))


class ParallelOps:
    """``moe_remap_ids``, ``embedding_shard`` and ``gather_vocab_shards`` on one cuda backend.

    Args:
        ctx: the backend's ``OpContext`` (workspace outputs, kernels, launch on its stream).
    """

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def moe_remap_ids(self, topk_weights: Any, topk_ids: Any, expert_start: int,
                      num_local_experts: int) -> tuple[Any, Any]:
        if topk_weights.dtype != np.float32 or topk_ids.dtype != np.int32:
            raise TypeError("moe_remap_ids: expected float32 weights and int32 ids, got "
                            f"{topk_weights.dtype} and {topk_ids.dtype}")
        weights = self.ctx.out(topk_weights.shape, np.float32)
        ids = self.ctx.out(topk_ids.shape, np.int32)
        n = topk_ids.size
        if n:
            self.ctx.launch(self.ctx.kernel("parallel", np.float32, "moe_remap_ids"),
                            -(-n // THREADS), THREADS, weights, ids, topk_weights, topk_ids,
                            np.int32(expert_start), np.int32(num_local_experts), np.int64(n))
        return weights, ids

    def embedding_shard(self, ids: Any, table: Any, vocab_start: int) -> Any:
        rows, hidden = table.shape
        out = self.ctx.out((ids.shape[0], hidden), table.dtype)
        if ids.shape[0]:
            self.ctx.launch(self.ctx.kernel("parallel", table.dtype, "embedding_shard"),
                            ids.shape[0], min(THREADS, max(32, hidden)), out, ids, table,
                            np.int64(vocab_start), np.int64(rows), np.int32(hidden))
        return out

    def gather_vocab_shards(self, shards: Any, vocab_size: int) -> Any:
        _, rows, n = shards.shape
        out = self.ctx.out((rows, vocab_size), shards.dtype)
        if rows and vocab_size:
            self.ctx.launch(self.ctx.kernel("parallel", shards.dtype, "gather_vocab_shards"),
                            (-(-vocab_size // THREADS), rows), THREADS, out, shards,
                            np.int32(rows), np.int32(n), np.int32(vocab_size))
        return out
