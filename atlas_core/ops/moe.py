"""Reference mixture-of-experts ops: top-k routing and expert compute."""

from __future__ import annotations

import numpy as np

from atlas_core.ops._dtypes import f32
from atlas_core.ops.norm import ACTIVATIONS


def moe_route(router_logits: np.ndarray, top_k: int, renormalize: bool,
              scoring: str = "softmax") -> tuple[np.ndarray, np.ndarray]:
    """Pick ``top_k`` experts per token.

    Args:
        router_logits: ``[num_tokens, num_experts]``.
        top_k: experts per token.
        renormalize: divide the chosen weights by their sum (``norm_topk_prob``).
        scoring: ``"softmax"`` (over all experts, in float32) or ``"sigmoid"``.

    Returns:
        ``(topk_weights [num_tokens, top_k] float32, topk_ids [num_tokens, top_k] int32)``, the
        experts in descending weight order (ties: lower expert index first).
    """
    logits = f32(router_logits)
    if scoring == "softmax":
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        scores = e / e.sum(axis=-1, keepdims=True)
    elif scoring == "sigmoid":
        scores = 1.0 / (1.0 + np.exp(-logits))
    else:
        raise ValueError(f"unsupported MoE scoring {scoring!r}; use softmax or sigmoid")
    ids = np.argsort(-scores, axis=-1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(scores, ids, axis=-1)
    if renormalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights.astype(np.float32), ids.astype(np.int32)


def moe_experts(x: np.ndarray, w_gate_up: np.ndarray, w_down: np.ndarray, topk_weights: np.ndarray,
                topk_ids: np.ndarray, activation: str = "silu") -> np.ndarray:
    """Weighted sum of each token's chosen experts' gated MLPs.

    ``out[t] = sum_j topk_weights[t, j] * down_e(act(gate_e(x[t])) * up_e(x[t]))`` with
    ``e = topk_ids[t, j]``.

    Args:
        x: ``[num_tokens, hidden]``.
        w_gate_up: ``[num_experts, 2 * intermediate, hidden]`` (gate rows, then up rows).
        w_down: ``[num_experts, hidden, intermediate]``.
        topk_weights: ``[num_tokens, top_k]`` float32.
        topk_ids: ``[num_tokens, top_k]`` int32.
        activation: ``"silu"`` or ``"gelu_tanh"``.

    Returns:
        ``[num_tokens, hidden]`` in ``x.dtype``.
    """
    act = ACTIVATIONS[activation]
    xf = f32(x)
    out = np.zeros(x.shape, dtype=np.float32)
    inter = w_down.shape[-1]
    for e in np.unique(topk_ids):
        rows, slots = np.nonzero(topk_ids == e)
        gate_up = xf[rows] @ f32(w_gate_up[e]).T
        h = act(gate_up[:, :inter]) * gate_up[:, inter:]
        out[rows] += (h @ f32(w_down[e]).T) * topk_weights[rows, slots][:, None]
    return out.astype(x.dtype)
