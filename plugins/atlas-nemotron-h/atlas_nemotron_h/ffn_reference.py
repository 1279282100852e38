"""NumPy references of Nemotron-H's feed-forward ops: the squared ReLU, the grouped sigmoid
router with a correction bias, and non-gated (up / down) experts. Registered as op specs by
:mod:`atlas_nemotron_h.plugin`."""

from __future__ import annotations

import numpy as np

from atlas_core.api import QuantizedWeight, dequantize, f32, reference


def _weight_f32(w) -> np.ndarray:
    """float32 value of a weight: a :class:`QuantizedWeight` (an FP8 / NVFP4 checkpoint's experts
    kept quantized) dequantized exactly, an array as is."""
    return dequantize(w) if isinstance(w, QuantizedWeight) else f32(w)


def relu2(x: np.ndarray) -> np.ndarray:
    """Squared ReLU, ``max(x, 0) ** 2`` in float32 (HF ``relu2``).

    Args:
        x: any shape.

    Returns:
        Same shape, in ``x.dtype``.
    """
    r = np.maximum(f32(x), 0.0)
    return (r * r).astype(x.dtype)


def nemotron_h_moe_route(x: np.ndarray, router_weight: np.ndarray,
                         correction_bias: np.ndarray, top_k: int, n_group: int = 1,
                         topk_group: int = 1, renormalize: bool = True,
                         routed_scaling_factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek-V3-style routing as HF ``NemotronHTopkRouter`` does it.

    ``logits = x @ router_weight.T`` in float32 (the activations widened first), ``s =
    sigmoid(logits)``, ``choice = s + correction_bias``. Experts form ``n_group`` groups; a
    group scores the sum of its two best ``choice`` values and only the ``topk_group`` best
    groups compete. The ``top_k`` largest ``choice`` values there pick the experts (ties: lower
    expert index first); their weights are ``s`` (without the bias), divided by
    ``sum + 1e-20`` when ``renormalize``, times ``routed_scaling_factor``.

    Args:
        x: ``[num_tokens, hidden]``.
        router_weight: ``[num_experts, hidden]`` (float32 in checkpoints).
        correction_bias: ``[num_experts]`` (``e_score_correction_bias``).
        top_k: experts per token.
        n_group, topk_group: expert groups and groups kept per token.
        renormalize: ``norm_topk_prob``.
        routed_scaling_factor: scale of the chosen weights.

    Returns:
        ``(topk_weights [num_tokens, top_k] float32, topk_ids [num_tokens, top_k] int32)`` in
        descending order of the biased score.
    """
    logits = f32(x) @ f32(router_weight).T
    scores = 1.0 / (1.0 + np.exp(-logits))
    choice = scores + f32(correction_bias)[None, :]
    return reference.select_grouped_topk(scores, choice, top_k, n_group, topk_group, renormalize,
                                         routed_scaling_factor)


def nemotron_h_moe_experts(x: np.ndarray, w_up: np.ndarray, w_down: np.ndarray,
                           topk_weights: np.ndarray, topk_ids: np.ndarray,
                           shared_up: np.ndarray | None = None,
                           shared_down: np.ndarray | None = None) -> np.ndarray:
    """Weighted sum of each token's chosen non-gated experts, plus the shared expert if given.

    ``out[t] = sum_j topk_weights[t, j] * down_e(relu2(up_e(x[t])))`` with
    ``e = topk_ids[t, j]``, plus ``shared_down(relu2(shared_up(x[t])))`` when the shared
    expert's weights are passed, all in float32 and rounded once. (HF adds the shared expert
    to the routed sum in the activation dtype; taking it here lets the cuda decode kernels run
    it with the routed experts, and differs from HF only by bf16 rounding.)

    Args:
        x: ``[num_tokens, hidden]`` (the latent when the model projects into one).
        w_up: ``[num_experts, intermediate, hidden]`` (this and every weight below may be a
            :class:`~atlas_core.api.QuantizedWeight` of that shape: its exact dequantized value).
        w_down: ``[num_experts, hidden, intermediate]``.
        topk_weights: ``[num_tokens, top_k]`` float32.
        topk_ids: ``[num_tokens, top_k]`` int32.
        shared_up: ``[shared_intermediate, hidden]`` (both or neither of the shared pair).
        shared_down: ``[hidden, shared_intermediate]``.

    Returns:
        ``[num_tokens, hidden]`` in ``x.dtype``.
    """
    if (shared_up is None) != (shared_down is None):
        raise ValueError("nemotron_h_moe_experts: pass both shared_up and shared_down, or neither")
    xf = f32(x)
    out = np.zeros(x.shape, dtype=np.float32)
    ids = np.asarray(topk_ids)
    for e in np.unique(ids):
        rows, slots = np.nonzero(ids == e)
        h = np.maximum(xf[rows] @ _weight_f32(w_up[int(e)]).T, 0.0)
        # add.at: a token may name an expert twice (expert parallelism's remapped choices)
        np.add.at(out, rows, ((h * h) @ _weight_f32(w_down[int(e)]).T)
                  * f32(topk_weights)[rows, slots][:, None])
    if shared_up is not None:
        h = np.maximum(xf @ _weight_f32(shared_up).T, 0.0)
        out += (h * h) @ _weight_f32(shared_down).T
    return out.astype(x.dtype)
