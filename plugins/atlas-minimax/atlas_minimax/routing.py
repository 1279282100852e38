"""``moe_route_biased``: sigmoid top-k routing whose expert choice adds a correction bias
(MiniMax-M2, DeepSeek-V3 style ``e_score_correction_bias``)."""

from __future__ import annotations

import numpy as np

from atlas_core.api import f32


def moe_route_biased(router_logits: np.ndarray, correction_bias: np.ndarray, top_k: int,
                     renormalize: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Pick ``top_k`` experts per token by ``sigmoid(logits) + bias``; weigh them without it.

    ``s = sigmoid(router_logits)`` in float32; the chosen experts are the ``top_k`` largest
    ``s + correction_bias`` (ties: lower expert index first); their weights are ``s`` at those
    experts, divided by their sum when ``renormalize``. The bias only steers the choice (HF
    ``MiniMaxM2TopKRouter``).

    Args:
        router_logits: ``[num_tokens, num_experts]``, any float dtype.
        correction_bias: ``[num_experts]``, any float dtype (float32 in checkpoints).
        top_k: experts per token, ``1 <= top_k <= num_experts``.
        renormalize: divide the chosen weights by their sum.

    Returns:
        ``(topk_weights [num_tokens, top_k] float32, topk_ids [num_tokens, top_k] int32)``, in
        descending order of the biased score.
    """
    scores = 1.0 / (1.0 + np.exp(-f32(router_logits)))
    choice = scores + f32(correction_bias)[None, :]
    ids = np.argsort(-choice, axis=-1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(scores, ids, axis=-1)
    if renormalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights.astype(np.float32), ids.astype(np.int32)
