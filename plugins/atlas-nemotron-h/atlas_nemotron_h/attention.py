"""Nemotron-H attention (layer ``nemotron_h_attention``): GQA without positional encoding."""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.api import Attention

#: Features the identity rotation covers (the smallest table the rotary ops take).
IDENTITY_ROTARY_DIM = 2


class NoPEAttention(Attention):
    """Self-attention without rotary embeddings (HF ``NemotronHAttention`` applies none; the
    Mamba-2 layers carry position): the paged attention of
    :class:`~atlas_core.model.layers.attention.Attention` with an identity rotation table
    (``cos = 1``, ``sin = 0`` over :data:`IDENTITY_ROTARY_DIM` features), which leaves q and k
    bit for bit unchanged. No biases (HF builds the projections with ``bias=False``).

    Args:
        hidden_size, num_heads, num_kv_heads, head_dim: as ``Attention``.
        max_position_embeddings: rows of the (identity) table.
    """

    def __init__(self, *, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 max_position_embeddings: int) -> None:
        super().__init__(hidden_size=hidden_size, num_heads=num_heads, num_kv_heads=num_kv_heads,
                         head_dim=head_dim, rope={"rope_type": "default", "rope_theta": 10000.0},
                         max_position_embeddings=max_position_embeddings)
        self.rotary_dim = IDENTITY_ROTARY_DIM

    def setup(self) -> None:
        table: Any = np.zeros((self.max_position_embeddings, IDENTITY_ROTARY_DIM), np.float32)
        table[:, : IDENTITY_ROTARY_DIM // 2] = 1.0
        self.cos_sin_cache = self.backend.from_host(table)
