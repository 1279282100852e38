"""``moe_route_grouped``: group-limited top-k routing of DeepSeek-V3 and Mistral-4 MoE layers."""

from __future__ import annotations

import numpy as np

from atlas_core.api import f32, reference

#: Router score functions: DeepSeek-V3 scores with a sigmoid, Mistral-4 with a softmax.
SCORING = ("sigmoid", "softmax")


def router_scores(router_logits: np.ndarray, scoring: str) -> np.ndarray:
    """``sigmoid`` or ``softmax`` (over experts) of the logits, in float32."""
    logits = f32(router_logits)
    if scoring == "sigmoid":
        return 1.0 / (1.0 + np.exp(-logits))
    if scoring == "softmax":
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    raise ValueError(f"scoring must be one of {SCORING}, got {scoring!r}")


def moe_route_grouped(router_logits: np.ndarray, correction_bias: np.ndarray | None, top_k: int,
                      num_groups: int, topk_groups: int, scoring: str = "sigmoid",
                      renormalize: bool = True,
                      routed_scaling_factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Choose ``top_k`` experts per token inside the best ``topk_groups`` expert groups.

    As HF ``DeepseekV3TopkRouter`` / ``Mistral4TopkRouter``: ``s = scoring(logits)`` (float32);
    the choice score is ``s + correction_bias`` (no bias: ``s``); experts form ``num_groups``
    consecutive groups, a group's score is the sum of its two best choice scores, and only the
    ``topk_groups`` best groups compete; the ``top_k`` best choice scores among their experts
    win (ties: lower index). Weights are ``s`` at the winners, divided by ``sum + 1e-20`` when
    ``renormalize``, then times ``routed_scaling_factor``.

    Args:
        router_logits: ``[num_tokens, num_experts]``, any float dtype.
        correction_bias: ``[num_experts]`` float32 (``e_score_correction_bias``) or None.
        top_k: experts per token, at most ``topk_groups * num_experts / num_groups``.
        num_groups: ``n_group``, dividing ``num_experts`` (1: plain top-k).
        topk_groups: ``topk_group``, ``1 <= topk_groups <= num_groups``.
        scoring: ``"sigmoid"`` or ``"softmax"``.
        renormalize: ``norm_topk_prob``.
        routed_scaling_factor: multiplies the final weights.

    Returns:
        ``(topk_weights [num_tokens, top_k] float32, topk_ids [num_tokens, top_k] int32)`` in
        descending choice-score order.
    """
    scores = router_scores(router_logits, scoring)
    choice = scores if correction_bias is None else scores + f32(correction_bias)[None, :]
    return reference.select_grouped_topk(scores, choice, top_k, num_groups, topk_groups,
                                         renormalize, routed_scaling_factor)
