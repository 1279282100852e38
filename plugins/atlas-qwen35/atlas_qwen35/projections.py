"""Input projections whose weights are row blocks of one stacked parameter."""

from __future__ import annotations

from typing import Any


def project_blocks(ops: Any, hidden: Any, weight: Any, sizes: list[int]) -> list[Any]:
    """``[ops.linear(hidden, block) for block in row blocks of weight]``, block ``i`` holding
    ``sizes[i]`` rows.

    For one token (batch-1 decode) this is a single ``linear`` over the whole ``weight`` whose
    output row is cut into contiguous views: one GEMV launch instead of ``len(sizes)``, each
    output value computed exactly as the separate launches compute it.

    Args:
        ops: a backend's op table.
        hidden: ``[num_tokens, in_features]``.
        weight: ``[sum(sizes), in_features]``.
        sizes: rows of each block, in order.

    Returns:
        One ``[num_tokens, sizes[i]]`` array per block.
    """
    num_tokens = hidden.shape[0]
    bounds = [0]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    if num_tokens != 1:
        return [ops.linear(hidden, weight[a:b]) for a, b in zip(bounds, bounds[1:])]
    row = ops.linear(hidden, weight).reshape(bounds[-1])
    return [row[a:b].reshape(1, b - a) for a, b in zip(bounds, bounds[1:])]
