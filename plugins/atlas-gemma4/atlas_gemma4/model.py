"""The Gemma-4 causal LM: the generic loop plus embedding scaling and final logit soft-capping."""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.api import CausalLM

from atlas_gemma4.attention import gemma4_cos_sin_cache


class Gemma4CausalLM(CausalLM):
    """:class:`CausalLM` with Gemma's differences around the layer stack.

    - Embeddings are multiplied by ``sqrt(hidden_size)`` rounded to the model dtype (as HF does).
    - Logits are soft-capped, ``cap * tanh(logits / cap)``, when ``final_logit_softcapping`` is set.
    - Attention layers of one type share one rotary table (a 128k x 512 float32 table is 256 MiB).

    Args:
        config, layers, **kwargs: as :class:`CausalLM`.
        final_logit_softcapping: the cap, or None.
    """

    def __init__(self, config: dict[str, Any], layers: Any, *,
                 final_logit_softcapping: float | None = None, **kwargs: Any) -> None:
        super().__init__(config, layers, **kwargs)
        self.final_logit_softcapping = final_logit_softcapping
        self.embed_scale: Any = None

    def setup(self) -> None:
        self.embed_scale = self.backend.from_host(
            np.array([self.hidden_size ** 0.5], dtype=self.dtype))
        tables: dict[tuple, Any] = {}
        for layer in self.layers:
            attention = layer.attention
            key = attention.rotary_key()
            if key not in tables:
                tables[key] = self.backend.from_host(gemma4_cos_sin_cache(
                    attention.head_dim, self.max_position_embeddings, attention.rope))
            attention.set_rotary(tables[key])

    def embed(self, input_ids: Any) -> Any:
        """Embeddings times ``sqrt(hidden_size)`` (in the model dtype, as HF rounds it); the
        generic loop of :meth:`CausalLM.forward` (with its per-layer workspace reuse) does the
        rest, as every Gemma-4 block returns its residual already added."""
        return self.ops.mul(super().embed(input_ids), self.embed_scale)

    def compute_logits(self, hidden: Any, logits_indices: Any) -> Any:
        """As :meth:`CausalLM.compute_logits`, then the soft cap (float32)."""
        logits = super().compute_logits(hidden, logits_indices)
        if self.final_logit_softcapping:
            logits = self.ops.softcap(logits, float(self.final_logit_softcapping))
        return logits
