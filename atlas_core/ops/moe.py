"""Reference mixture-of-experts ops: top-k routing and expert compute."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from atlas_core.ops._dtypes import f32
from atlas_core.ops.norm import (ACTIVATIONS, add, linear, linear_act_and_mul, rms_norm,
                                 sigmoid_mul)
from atlas_core.ops.quant import weight_f32


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


def select_grouped_topk(scores: np.ndarray, choice: np.ndarray, top_k: int, num_groups: int = 1,
                        topk_groups: int = 1, renormalize: bool = True,
                        routed_scaling_factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Group-limited top-k expert choice (DeepSeek-V3's ``noaux_tc``), shared by the routers
    of several families (not an op of its own).

    Experts form ``num_groups`` consecutive groups; a group scores the sum of its two best
    ``choice`` values and only the ``topk_groups`` best groups compete. The ``top_k`` largest
    ``choice`` values among their experts win (ties: lower index first); the weights are
    ``scores`` at the winners, divided by ``sum + 1e-20`` when ``renormalize``, then times
    ``routed_scaling_factor``.

    Args:
        scores: ``[num_tokens, num_experts]`` float32 router scores (the weights).
        choice: ``[num_tokens, num_experts]`` float32 scores the experts are chosen by (e.g.
            ``scores + e_score_correction_bias``).
        top_k: experts per token.
        num_groups, topk_groups: ``n_group`` (dividing ``num_experts``; 1: plain top-k) and
            ``topk_group``.
        renormalize: ``norm_topk_prob``.
        routed_scaling_factor: multiplies the final weights.

    Returns:
        ``(topk_weights [num_tokens, top_k] float32, topk_ids [num_tokens, top_k] int32)`` in
        descending ``choice`` order.
    """
    tokens, experts = choice.shape
    if num_groups > 1:
        grouped = choice.reshape(tokens, num_groups, experts // num_groups)
        best_two = -np.sort(-grouped, axis=-1)[..., :2].sum(axis=-1)
        keep = np.argsort(-best_two, axis=-1, kind="stable")[:, :topk_groups]
        allowed = np.zeros((tokens, num_groups), dtype=bool)
        np.put_along_axis(allowed, keep, True, axis=-1)
        mask = np.repeat(allowed, experts // num_groups, axis=-1)
        choice = np.where(mask, choice, -np.inf)
    ids = np.argsort(-choice, axis=-1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(scores, ids, axis=-1)
    if renormalize:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
    weights = weights * np.float32(routed_scaling_factor)
    return weights.astype(np.float32), ids.astype(np.int32)


def moe_experts(x: np.ndarray, w_gate_up: np.ndarray, w_down: np.ndarray, topk_weights: np.ndarray,
                topk_ids: np.ndarray, activation: str = "silu") -> np.ndarray:
    """Weighted sum of each token's chosen experts' gated MLPs.

    ``out[t] = sum_j topk_weights[t, j] * down_e(act(gate_e(x[t])) * up_e(x[t]))`` with
    ``e = topk_ids[t, j]``. Choices with weight 0 are skipped: expert parallelism marks other
    ranks' experts that way (weight 0, id 0), and a backend need read none of their expert's
    bytes (the cuda kernels read none; such a choice contributes zero either way).

    Args:
        x: ``[num_tokens, hidden]``.
        w_gate_up: ``[num_experts, 2 * intermediate, hidden]`` (gate rows, then up rows).
        w_down: ``[num_experts, hidden, intermediate]``.
        topk_weights: ``[num_tokens, top_k]`` float32.
        topk_ids: ``[num_tokens, top_k]`` int32.
        activation: ``"silu"`` or ``"gelu_tanh"``.

    Either weight may be a :class:`~atlas_core.ops.quant.QuantizedWeight` of that shape
    (computed with its exact float32 dequantization).

    Returns:
        ``[num_tokens, hidden]`` in ``x.dtype``.
    """
    act = ACTIVATIONS[activation]
    xf = f32(x)
    out = np.zeros(x.shape, dtype=np.float32)
    inter = w_down.shape[-1]
    w1, w2 = weight_f32(w_gate_up), weight_f32(w_down)
    for e in np.unique(topk_ids):
        rows, slots = np.nonzero(topk_ids == e)
        gate_up = xf[rows] @ w1[e].T
        h = act(gate_up[:, :inter]) * gate_up[:, inter:]
        # add.at: a token may name an expert twice (expert parallelism remaps other ranks'
        # choices to local expert 0 with weight 0); out[rows] += would keep only the last
        np.add.at(out, rows, (h @ w2[e].T) * topk_weights[rows, slots][:, None])
    return out.astype(x.dtype)


def compose_moe_block(ops, x, router_weight, w_gate_up, w_down, top_k, renormalize,
                      scoring="softmax", activation="silu", shared_gate_up=None,
                      shared_down=None, shared_gate=None, router_logits=None):
    """:func:`moe_block` as the separate ops of ``ops`` (any op table: the references, a
    backend's ``backend.ops``), one op after another; ``router_logits``: ``linear(x,
    router_weight)`` when the caller has already computed it (a backend's fused norm GEMV)."""
    if router_logits is None:
        router_logits = ops.linear(x, router_weight)
    topk_weights, topk_ids = ops.moe_route(router_logits, top_k, renormalize, scoring)
    out = ops.moe_experts(x, w_gate_up, w_down, topk_weights, topk_ids, activation)
    if shared_gate_up is None:
        return out
    shared = ops.linear(ops.linear_act_and_mul(x, shared_gate_up, None, activation), shared_down)
    if shared_gate is not None:
        shared = ops.sigmoid_mul(shared, ops.linear(x, shared_gate))
    return ops.add(out, shared)


def moe_block(x: np.ndarray, router_weight: np.ndarray, w_gate_up: np.ndarray,
              w_down: np.ndarray, top_k: int, renormalize: bool, scoring: str = "softmax",
              activation: str = "silu", shared_gate_up: np.ndarray | None = None,
              shared_down: np.ndarray | None = None,
              shared_gate: np.ndarray | None = None) -> np.ndarray:
    """A whole sparse-MoE feed-forward as one op (backends may fuse it for decode batches).

    ``moe_experts(x, w_gate_up, w_down, *moe_route(linear(x, router_weight), top_k,
    renormalize, scoring), activation)``, plus, with a shared expert,
    ``linear(linear_act_and_mul(x, shared_gate_up, None, activation), shared_down)``, scaled by
    ``sigmoid(linear(x, shared_gate))`` when a gate is given (``sigmoid_mul``) and added
    (``add``). Every intermediate is rounded as those ops round it.

    Args:
        x: ``[num_tokens, hidden]``.
        router_weight: ``[num_experts, hidden]``.
        w_gate_up: ``[num_experts, 2 * intermediate, hidden]`` (gate rows, then up rows).
        w_down: ``[num_experts, hidden, intermediate]``.
        top_k: experts per token.
        renormalize: divide the chosen weights by their sum.
        scoring: ``"softmax"`` or ``"sigmoid"`` router scores.
        activation: ``"silu"`` or ``"gelu_tanh"``.
        shared_gate_up: optional shared expert ``[2 * shared_intermediate, hidden]``.
        shared_down: ``[hidden, shared_intermediate]``, with ``shared_gate_up``.
        shared_gate: optional ``[1, hidden]`` gate of the shared expert.

    Returns:
        ``[num_tokens, hidden]`` in ``x.dtype``.
    """
    if (shared_gate_up is None) != (shared_down is None):
        raise ValueError("moe_block: give shared_gate_up and shared_down together")
    return compose_moe_block(_REFERENCE_OPS, x, router_weight, w_gate_up, w_down, top_k,
                             renormalize, scoring, activation, shared_gate_up, shared_down,
                             shared_gate)


def rms_norm_moe_block(x: np.ndarray, residual: np.ndarray | None, norm_weight: np.ndarray,
                       eps: float, zero_centered: bool, router_weight: np.ndarray,
                       w_gate_up: np.ndarray, w_down: np.ndarray, top_k: int, renormalize: bool,
                       scoring: str = "softmax", activation: str = "silu",
                       shared_gate_up: np.ndarray | None = None,
                       shared_down: np.ndarray | None = None,
                       shared_gate: np.ndarray | None = None):
    """The MoE block's pre-norm and the block as one op (backends may fold the norm and the
    residual add into the router): ``moe_block(rms_norm(x, norm_weight, eps, residual), ...)``.

    Rounds as the separate ops do (the residual sum and the normed rows are stored in
    ``x.dtype``). Arguments after ``zero_centered`` are :func:`moe_block`'s; the first four are
    :func:`atlas_core.ops.norm.rms_norm_linear`'s.

    Returns:
        ``(out, residual_out)``: ``out`` ``[num_tokens, hidden]`` in ``x.dtype`` and the new
        residual stream ``x + residual`` (``x`` itself when ``residual`` is ``None``).
    """
    return compose_rms_norm_moe_block(_REFERENCE_OPS, x, residual, norm_weight, eps,
                                      zero_centered, router_weight, w_gate_up, w_down, top_k,
                                      renormalize, scoring, activation, shared_gate_up,
                                      shared_down, shared_gate)


def compose_rms_norm_moe_block(ops, x, residual, norm_weight, eps, zero_centered, *moe_args,
                               **moe_kwargs):
    """:func:`rms_norm_moe_block` as ``ops.rms_norm`` then ``ops.moe_block`` (any op table)."""
    if residual is None:
        h, r = ops.rms_norm(x, norm_weight, eps, zero_centered=zero_centered), x
    else:
        h, r = ops.rms_norm(x, norm_weight, eps, residual, zero_centered=zero_centered)
    return ops.moe_block(h, *moe_args, **moe_kwargs), r



def unfused_moe_block(ops, x, router_weight, w_gate_up, w_down, top_k, renormalize,
                      scoring="softmax", activation="silu", shared_gate_up=None,
                      shared_down=None, shared_gate=None):
    """The unfused definition of :func:`moe_block` (its exact signature over ``ops``)."""
    return compose_moe_block(ops, x, router_weight, w_gate_up, w_down, top_k, renormalize,
                             scoring, activation, shared_gate_up, shared_down, shared_gate)


def unfused_rms_norm_moe_block(ops, x, residual, norm_weight, eps, zero_centered, router_weight,
                               w_gate_up, w_down, top_k, renormalize, scoring="softmax",
                               activation="silu", shared_gate_up=None, shared_down=None,
                               shared_gate=None):
    """The unfused definition of :func:`rms_norm_moe_block` (its exact signature over ``ops``)."""
    return compose_rms_norm_moe_block(ops, x, residual, norm_weight, eps, zero_centered,
                                      router_weight, w_gate_up, w_down, top_k, renormalize,
                                      scoring, activation, shared_gate_up, shared_down,
                                      shared_gate)


_REFERENCE_OPS = SimpleNamespace(linear=linear, linear_act_and_mul=linear_act_and_mul, add=add,
                                 sigmoid_mul=sigmoid_mul, moe_route=moe_route,
                                 moe_experts=moe_experts, moe_block=moe_block, rms_norm=rms_norm)
