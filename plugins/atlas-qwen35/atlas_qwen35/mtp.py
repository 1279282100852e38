"""The multi-token-prediction (MTP) head of Qwen3.5 / Qwen3.6 / Qwen3-Next checkpoints.

Checkpoint layout (``mtp.*``, next to the text model; ``mtp_num_hidden_layers`` in Qwen3.5
configs, ``num_nextn_predict_layers`` in Qwen3-Next's): ``pre_fc_norm_embedding.weight`` and
``pre_fc_norm_hidden.weight`` (zero-centred RMSNorms of the next token's embedding and of the
target's final hidden state), ``fc.weight`` ``[hidden, 2 * hidden]`` over their concatenation
(embedding first), ``layers.0.*`` one full-attention decoder block (gated attention, then the
family's MLP or shared-expert MoE), and ``norm.weight``; the embedding table and ``lm_head``
are the model's own. That is core's :class:`~atlas_core.model.layers.mtp.MTPHead` with
zero-centred norms. HF transformers does not load these tensors; vLLM's ``qwen3_next_mtp`` and
``qwen3_5_mtp`` define the same forward.
"""

from __future__ import annotations

from typing import Any


def num_mtp_layers(config: dict[str, Any]) -> int:
    """MTP blocks a config declares (Qwen3.5 / Qwen3-Next field names)."""
    return int(config.get("mtp_num_hidden_layers") or config.get("num_nextn_predict_layers") or 0)
