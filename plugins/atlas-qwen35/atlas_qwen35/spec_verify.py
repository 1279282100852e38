"""Gated DeltaNet under speculative verification: one recurrent state per query position.

Each position of a verify step runs the decode op (``gated_delta_rule_decode``) from the state
its previous position left in its own row: core's ``recurrent_verify`` (eager) and
``recurrent_verify_graph`` (a verify step replayed from a graph) do the rows, copies and
ordering (their module docstring, ``atlas_core.model.recurrent_verify``, says how rejection
rolls the state back); this module gives them the layer's decode op.
"""

from __future__ import annotations

from typing import Any

from atlas_core.api import StepMetadata, recurrent_verify, recurrent_verify_graph


def _step(layer: Any, qkv: Any, z: Any, ba: Any):
    ops, p = layer.ops, layer.params
    pools = (layer.state["conv"], layer.state["ssm"])
    heads = dict(num_k_heads=layer.num_k_heads, num_v_heads=layer.num_v_heads,
                 head_k_dim=layer.head_k_dim, head_v_dim=layer.head_v_dim)

    def step(rows, cu, seq_lens, state):
        return ops.gated_delta_rule_decode(
            ops.embedding(rows, qkv), ops.embedding(rows, z), ops.embedding(rows, ba),
            p["conv1d.weight"], p["A_log"], p["dt_bias"], p["norm.weight"], pools[0], pools[1],
            cu, seq_lens, state, **heads, eps=layer.eps)
    return step


def gdn_verify(layer: Any, qkv: Any, z: Any, ba: Any, meta: StepMetadata) -> Any:
    """The core output ``[num_tokens, num_v_heads, head_v_dim]`` of a verify step
    (``meta.spec_state_rows`` lists each sequence's state rows).

    Args:
        layer: the :class:`~atlas_qwen35.gated_deltanet.GatedDeltaNet` (ops, params, pools).
        qkv, z, ba: the step's projected inputs, token rows packed by sequence.
        meta: the step.
    """
    pools = [layer.state["conv"], layer.state["ssm"]]
    core = recurrent_verify(layer.ops, layer.backend, meta, pools, _step(layer, qkv, z, ba),
                            layer.num_v_heads * layer.head_v_dim, qkv.dtype)
    return core.reshape(meta.num_tokens, layer.num_v_heads, layer.head_v_dim)


def gdn_verify_graph(layer: Any, qkv: Any, z: Any, ba: Any, meta: StepMetadata) -> Any:
    """:func:`gdn_verify` for a verify step captured in a graph (``meta.spec_verify``)."""
    pools = [layer.state["conv"], layer.state["ssm"]]
    core = recurrent_verify_graph(layer.ops, layer.backend, meta, pools,
                                  _step(layer, qkv, z, ba), layer.num_v_heads * layer.head_v_dim,
                                  qkv.dtype, "gdn")
    return core.reshape(meta.num_tokens, layer.num_v_heads, layer.head_v_dim)
