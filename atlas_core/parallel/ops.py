"""The ops tensor and expert parallelism add: NumPy references (the op contract) and cases.

Declared by :mod:`atlas_core.parallel.plugin`; the cuda implementations ship with atlas-nccl.
"""

from __future__ import annotations

import numpy as np


def moe_remap_ids(topk_weights: np.ndarray, topk_ids: np.ndarray, expert_start: int,
                  num_local_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Route a token's choices to this rank's experts (expert parallelism).

    ``ids[t, j] = topk_ids[t, j] - expert_start`` where that expert is one of the
    ``num_local_experts`` this rank holds, else ``0`` with ``weights[t, j] = 0`` (the choice
    is computed by its own rank; here it adds nothing).

    Args:
        topk_weights: ``[num_tokens, top_k]`` float32 (from ``moe_route``).
        topk_ids: ``[num_tokens, top_k]`` int32 global expert ids.
        expert_start: first global expert of this rank.
        num_local_experts: experts this rank holds.

    Returns:
        ``(weights [num_tokens, top_k] float32, ids [num_tokens, top_k] int32)``.
    """
    ids = topk_ids.astype(np.int64) - int(expert_start)
    local = (ids >= 0) & (ids < int(num_local_experts))
    weights = np.where(local, topk_weights, 0.0).astype(np.float32)
    return weights, np.where(local, ids, 0).astype(np.int32)


def embedding_shard(ids: np.ndarray, table: np.ndarray, vocab_start: int) -> np.ndarray:
    """Rows of a vocabulary shard (vocab-parallel embedding): ``out[t] = table[ids[t] -
    vocab_start]`` where that row is in the shard, else zeros; summing every rank's output
    gives the full embedding.

    Args:
        ids: ``[num_tokens]`` int32 global token ids.
        table: ``[shard_rows, hidden]`` this rank's rows ``vocab_start ..``.
        vocab_start: first global id of the shard.

    Returns:
        ``[num_tokens, hidden]`` in ``table.dtype``.
    """
    local = ids.astype(np.int64) - int(vocab_start)
    inside = (local >= 0) & (local < table.shape[0])
    out = np.zeros((ids.shape[0], table.shape[1]), table.dtype)
    out[inside] = table[local[inside]]
    return out


def gather_vocab_shards(shards: np.ndarray, vocab_size: int) -> np.ndarray:
    """Logits of the whole vocabulary from every rank's shard (after an all-gather).

    ``out[r, s * n + c] = shards[s, r, c]`` for ``s * n + c < vocab_size``.

    Args:
        shards: ``[num_shards, num_rows, n]`` (rank ``s`` scored ids ``s*n .. s*n+n-1``; the
            last shard may be padded past ``vocab_size``).
        vocab_size: columns of the result.

    Returns:
        ``[num_rows, vocab_size]`` in ``shards.dtype``.
    """
    s, rows, n = shards.shape
    return np.ascontiguousarray(shards.transpose(1, 0, 2).reshape(rows, s * n)[:, :vocab_size])
