"""The generic causal LM loop: embed -> layers -> final norm -> lm_head."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from atlas_core.interfaces.layer import KVCacheSpec, RecurrentStateSpec, TransformerLayer
from atlas_core.interfaces.metadata import StepMetadata
from atlas_core.model.params import Module


class CausalLM(Module):
    """A decoder-only language model over any stack of :class:`TransformerLayer` objects.

    Parameters (HF names): ``model.embed_tokens.weight`` ``[vocab, hidden]``,
    ``model.layers.{i}.*`` (the layers'), ``model.norm.weight`` ``[hidden]`` and, unless the
    embeddings are tied, ``lm_head.weight`` ``[vocab, hidden]``.

    Args:
        config: the (text) ``config.json`` dict, kept as :attr:`config`.
        layers: one layer per decoder block, in order.
        hidden_size, vocab_size: model width and vocabulary rows.
        rms_norm_eps: epsilon of the final norm.
        tie_word_embeddings: the output head reuses the embedding table.
        max_position_embeddings: longest context the model supports.
        zero_centered_norm: the final norm weight is stored as ``w - 1``.

    Attributes:
        mtp: the multi-token-prediction head a family loader attached (``mtp.*`` weights, see
            :mod:`atlas_core.engine.spec.mtp`), else ``None``; its attention layer gets a KV
            pool (one more entry of :meth:`kv_cache_specs`) once :meth:`enable_mtp` ran.
    """

    def __init__(self, config: dict[str, Any], layers: Sequence[TransformerLayer], *, hidden_size: int,
                 vocab_size: int, rms_norm_eps: float = 1e-6, tie_word_embeddings: bool = False,
                 max_position_embeddings: int = 4096, zero_centered_norm: bool = False) -> None:
        super().__init__()
        self.config = config
        self.layers = list(layers)
        self.num_layers, self.hidden_size, self.vocab_size = len(self.layers), hidden_size, vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.eps, self.tie_word_embeddings = rms_norm_eps, tie_word_embeddings
        self.zero_centered_norm = zero_centered_norm
        self.declare("model.embed_tokens.weight", (vocab_size, hidden_size))
        for i, layer in enumerate(self.layers):
            self.add(f"model.layers.{i}", layer)
        self.declare("model.norm.weight", (hidden_size,))
        if not tie_word_embeddings:
            self.declare("lm_head.weight", (vocab_size, hidden_size))
        self._zero_logits: Any = None
        self.mtp: Any = None
        self.mtp_enabled = False

    def enable_mtp(self) -> bool:
        """Give the MTP head a KV pool from now on (call before the KV cache is planned);
        returns whether the model has a head."""
        self.mtp_enabled = self.mtp is not None
        return self.mtp_enabled

    @property
    def lm_head(self) -> Any:
        """The output projection ``[vocab, hidden]`` (the embedding table when tied)."""
        if self.tie_word_embeddings:
            return self.params["model.embed_tokens.weight"]
        return self.params["lm_head.weight"]

    def kv_cache_specs(self) -> list[KVCacheSpec | RecurrentStateSpec | None]:
        """The state each layer keeps between steps, one entry per layer."""
        specs = [layer.state_spec() for layer in self.layers]
        return specs + [self.mtp.state_spec()] if self.mtp_enabled else specs

    def bind_kv_caches(self, caches: Sequence[Any]) -> None:
        """Hand each layer its state (``(k_cache, v_cache)`` for attention, ``None`` if stateless)."""
        num = self.num_layers + self.mtp_enabled
        if len(caches) != num:
            raise ValueError(f"got {len(caches)} caches for {num} layers")
        for layer, cache in zip(self.layers + ([self.mtp] if self.mtp_enabled else []), caches):
            if cache is not None:
                layer.bind_state(cache)

    def forward(self, input_ids: Any, meta: StepMetadata) -> Any:
        """Run every layer over the batch.

        Args:
            input_ids: device int32 ``[num_tokens]``.
            meta: the step's :class:`StepMetadata`.

        Returns:
            Final-normed hidden states ``[num_tokens, hidden_size]`` in the model dtype.
        """
        ops = self.ops
        hidden = self.embed(input_ids)
        residual = None
        # the backend may reuse each layer's op outputs once the next layer has its inputs
        scope = self.backend.layer_scope(2 * hidden.nbytes)
        for layer in self.layers:
            hidden, residual = layer.forward(hidden, residual, meta)
            if scope is not None:
                hidden, residual = scope.carry(hidden, residual)
        norm = self.params["model.norm.weight"]
        if residual is None:
            return ops.rms_norm(hidden, norm, self.eps, zero_centered=self.zero_centered_norm)
        hidden, _ = ops.rms_norm(hidden, norm, self.eps, residual, zero_centered=self.zero_centered_norm)
        return hidden

    def embed(self, input_ids: Any) -> Any:
        """The input embeddings ``[num_tokens, hidden_size]`` of ``input_ids`` (a family that
        scales or adds to them overrides this, keeping the generic layer loop)."""
        return self.ops.embedding(input_ids, self.params["model.embed_tokens.weight"])

    def compute_logits(self, hidden: Any, logits_indices: Any) -> Any:
        """Logits of the rows ``logits_indices`` of ``hidden``.

        Args:
            hidden: ``[num_tokens, hidden_size]`` from :meth:`forward`.
            logits_indices: device int32 ``[num_outputs]``.

        Returns:
            Device float32 ``[num_outputs, vocab_size]`` (the head runs in the model dtype, like
            HF transformers, and the result is widened to float32).
        """
        ops = self.ops
        rows = ops.embedding(logits_indices, hidden)
        logits = ops.linear(rows, self.lm_head)
        if logits.dtype == np.float32:
            return logits
        return ops.add(self._zeros(logits.shape[0]), logits)

    def _zeros(self, num_rows: int) -> Any:
        # The op set has no cast: `add` into float32 zeros widens. Grown rarely, never per step.
        if self._zero_logits is None or self._zero_logits.shape[0] < num_rows:
            rows = max(num_rows, 256)
            self._zero_logits = self.backend.zeros((rows, self.vocab_size), np.float32)
        return self._zero_logits[:num_rows]
