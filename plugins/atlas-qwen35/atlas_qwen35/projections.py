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


def norm_project_blocks(ops: Any, hidden: Any, residual: Any | None, norm_weight: Any, eps: float,
                        zero_centered: bool, weight: Any, sizes: list[int]) -> tuple[list[Any], Any]:
    """:func:`project_blocks` of ``rms_norm(hidden + residual)``, the norm folded into the
    projections (``ops.rms_norm_linear``): the pre-norm protocol of
    :class:`~atlas_core.model.layers.decoder.DecoderLayer`.

    One token: a single ``rms_norm_linear`` over the whole ``weight``. More: one per block, the
    first adding the residual, the others normalising the summed stream again (the same values).

    Returns:
        ``(blocks, residual_out)``: one ``[num_tokens, sizes[i]]`` array per block and the new
        residual stream (``hidden`` itself when ``residual`` is ``None``).
    """
    bounds = [0]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    if hidden.shape[0] == 1:
        row, residual = ops.rms_norm_linear(hidden, residual, norm_weight, eps, weight, None,
                                            zero_centered)
        row = row.reshape(bounds[-1])
        return [row[a:b].reshape(1, b - a) for a, b in zip(bounds, bounds[1:])], residual
    blocks = []
    for a, b in zip(bounds, bounds[1:]):
        out, stream = ops.rms_norm_linear(hidden, residual, norm_weight, eps, weight[a:b], None,
                                          zero_centered)
        hidden, residual = stream, None
        blocks.append(out)
    return blocks, hidden
